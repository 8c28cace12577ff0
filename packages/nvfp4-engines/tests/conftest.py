"""Shared helpers. A test module of an engine that is not installed is not collected (CI
cannot build llama-cpp-python; the torch engines and the GPU-only ones are installed by the
``engines`` nox session only); ``NVFP4_REQUIRE_ENGINES`` (adapter names, comma-separated,
or ``all``; the nox ``engines`` session sets its engine) makes a missing engine an error."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes

#: adapter -> (its test module, the module its engine installs)
ENGINES = {
    "gguf-py": ("test_gguf_py.py", "gguf"),
    "mlx-native": ("test_mlx_native.py", "mlx"),
    "ggml": ("test_ggml.py", "llama_cpp"),
    "modelopt": ("test_modelopt.py", "modelopt"),
    "compressed-tensors": ("test_compressed_tensors.py", "compressed_tensors"),
    "torchao": ("test_torchao.py", "torchao"),
    "flashinfer": ("test_flashinfer.py", "flashinfer"),
    "vllm": ("test_vllm.py", "vllm"),
    "transformer-engine": ("test_transformer_engine.py", "transformer_engine"),
}
_required = os.environ.get("NVFP4_REQUIRE_ENGINES", "")
REQUIRED = set(ENGINES) if _required == "all" else {n for n in _required.split(",") if n}

if REQUIRED - set(ENGINES):
    raise RuntimeError(
        f"NVFP4_REQUIRE_ENGINES={_required!r}: expected adapter names from {sorted(ENGINES)} "
        "or 'all'"
    )

collect_ignore = []
for _name, (_file, _module) in ENGINES.items():
    if importlib.util.find_spec(_module) is None:
        if _name in REQUIRED:
            raise RuntimeError(
                f"NVFP4_REQUIRE_ENGINES names {_name!r}, but its engine ({_module!r}) is not "
                "installed"
            )
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
