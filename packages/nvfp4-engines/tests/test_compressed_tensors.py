"""The ``compressed-tensors`` adapter: its NVFP4 compressor / decompressor against the
reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import weight
from nvfp4 import get_backend, reference
from nvfp4.fusion import fuse, stack_experts


@pytest.fixture(scope="module")
def backend():
    return get_backend("compressed-tensors")


def test_decompressor_gives_bfloat16_values(backend) -> None:
    fused = fuse([weight(8, 64, 0, 0.01), weight(16, 64, 1, 50.0)], "qkv")
    stack = stack_experts([weight(8, 32, 2), weight(8, 32, 3, 4.0)], "experts")
    for p in (fused, stack):
        got = backend.to_numpy(backend.dequantize(p, "float32"))
        ref = reference.dequantize(p)
        assert got.shape == ref.shape
        # the decompressor's output is bfloat16 whatever is asked: float32 holds its values
        assert np.array_equal(got, got.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_allclose(got, ref, rtol=2.0**-8, atol=0)


def test_quantizer_matches_the_reference(backend, rng) -> None:
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations(x), reference.quantize_activations(x, None)
    np.testing.assert_array_max_ulp(got.global_scale, ref.global_scale, maxulp=1)
    assert np.array_equal(got.scales, ref.scales)
    assert np.array_equal(got.codes, ref.codes)


def test_static_input_scale_goes_in_as_input_global_scale(backend, rng) -> None:
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=0.0025)
    np.testing.assert_array_max_ulp(got.global_scale, np.float32(0.0025), maxulp=1)


def test_what_compressed_tensors_lacks_is_absent(backend) -> None:
    for verb in ("qmm", "gather_qmm", "qmm_w4a4", "qmm_w4a8"):
        assert not backend.has(verb)
    with pytest.raises(NotImplementedError, match=r"compressed-tensors.*no qmm kernel"):
        backend.qmm(np.ones((1, 64), np.float32), weight(4, 64, 6))
