"""The ``modelopt`` adapter: ModelOpt's NVFP4QTensor quantize / dequantize against the
reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import weight
from nvfp4 import get_backend, reference
from nvfp4.fusion import fuse, stack_experts


@pytest.fixture(scope="module")
def backend():
    return get_backend("modelopt")


def test_dequantize_float32_within_one_ulp_float16_in_its_dtype(backend) -> None:
    fused = fuse([weight(8, 64, 0, 0.01), weight(16, 64, 1, 50.0)], "gate_up")
    stack = stack_experts([weight(8, 32, 2), weight(8, 32, 3, 4.0)], "experts")
    for p in (fused, stack):
        got = backend.to_numpy(backend.dequantize(p, "float32"))
        # ModelOpt multiplies scale by global first, then by the code: one extra rounding
        np.testing.assert_array_max_ulp(got, reference.dequantize(p), maxulp=1)
        got16 = backend.to_numpy(backend.dequantize(p, "float16"))
        assert got16.dtype == np.float16


def test_quantizer_matches_the_reference_bit_for_bit(backend, rng) -> None:
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations(x), reference.quantize_activations(x, None)
    assert got.global_scale.tobytes() == ref.global_scale.tobytes()
    assert np.array_equal(got.scales, ref.scales)
    assert np.array_equal(got.codes, ref.codes)


def test_static_input_scale_is_modelopts_weight_scale_2(backend, rng) -> None:
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=0.0025)
    assert float(got.global_scale) == np.float32(0.0025)
    assert np.array_equal(got.scales, reference.quantize_activations(x, 0.0025).scales)


def test_what_modelopt_lacks_on_cpu_is_absent(backend) -> None:
    for verb in ("qmm", "gather_qmm", "qmm_w4a4", "qmm_w4a8"):
        assert not backend.has(verb)
    with pytest.raises(NotImplementedError, match=r"modelopt.*no qmm kernel"):
        backend.qmm(np.ones((1, 64), np.float32), weight(4, 64, 6))


def test_dequantize_is_the_emulated_scale_times_global_first(backend) -> None:
    """nvfp4.deviation_emulators' scale_times_global_first is what ModelOpt computes: equal
    values for float32, float16 and bfloat16 over random weights, where the plain reference
    differs for float32."""
    from nvfp4 import deviation_emulators as emu

    w = weight(32, 128, seed=11)
    prepared = backend.prepare(w)
    for dtype in ("float32", "float16", "bfloat16"):
        got = np.asarray(backend.to_numpy(backend.dequantize(prepared, dtype)), np.float32)
        want = emu.dequantize(w, dtype, deviations=["scale_times_global_first"])
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=dtype)
    got = np.asarray(backend.to_numpy(backend.dequantize(prepared, "float32")))
    assert not np.array_equal(got, reference.dequantize(w))
