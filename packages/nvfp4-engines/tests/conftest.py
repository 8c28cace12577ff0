"""Shared helpers. A test module of an engine that is not installed is not collected (CI
cannot build llama-cpp-python); ``NVFP4_REQUIRE_ENGINES=1`` (the nox ``engines`` session)
makes a missing engine an error instead."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes

ENGINE_MODULES = {
    "test_gguf_py.py": "gguf",
    "test_mlx_native.py": "mlx",
    "test_ggml.py": "llama_cpp",
}

collect_ignore = []
for _file, _module in ENGINE_MODULES.items():
    if importlib.util.find_spec(_module) is None:
        if os.environ.get("NVFP4_REQUIRE_ENGINES") == "1":
            raise RuntimeError(f"NVFP4_REQUIRE_ENGINES=1 but {_module!r} is not installed")
        collect_ignore.append(_file)


def weight(n: int, k: int, seed: int, scale: float = 1.0) -> NVFP4Planes:
    """Planes quantized from normal data by the reference encoder (a dynamic global)."""
    rng = np.random.default_rng(seed)
    return reference.quantize_activations(
        (rng.standard_normal((n, k)) * scale).astype(np.float32), None
    ).replace(name=f"w{n}x{k}")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
