"""The ``compressed-tensors`` adapter: its NVFP4 compressor / decompressor against the
reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from conftest import (
    assert_dequantize_is_emulated,
    assert_has_no_matmul,
    assert_quantizer_matches_the_reference,
    fused_and_stacked,
)
from nvfp4 import reference


def test_decompressor_gives_bfloat16_values(backend) -> None:
    for p in fused_and_stacked("qkv"):
        got = backend.to_numpy(backend.dequantize(p, "float32"))
        ref = reference.dequantize(p)
        assert got.shape == ref.shape
        # the decompressor's output is bfloat16 whatever is asked: float32 holds its values
        assert np.array_equal(got, got.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_allclose(got, ref, rtol=2.0**-8, atol=0)


def test_quantizer_matches_the_reference(backend, rng) -> None:
    assert_quantizer_matches_the_reference(backend, rng, global_maxulp=1)


def test_static_input_scale_goes_in_as_input_global_scale(backend, rng) -> None:
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=0.0025)
    np.testing.assert_array_max_ulp(got.global_scale, np.float32(0.0025), maxulp=1)


def test_what_compressed_tensors_lacks_is_absent(backend) -> None:
    assert_has_no_matmul(backend)


def test_the_emulated_deviations_are_what_compressed_tensors_computes(backend) -> None:
    """nvfp4.deviation_emulators' ct_bfloat16_decompress is the decompressor's output (every
    dtype), and ct_encode_global its encoder's planes for bfloat16 and float16 x (the
    plain reference's global or scales differ there)."""
    from nvfp4 import deviation_emulators as emu

    assert_dequantize_is_emulated(backend, "ct_bfloat16_decompress", seed=12)
    x = np.random.default_rng(13).standard_normal((32, 128)).astype(np.float32)
    differs = 0
    for scale in (1.0, 0.37):  # (at 3.1 some block scales differ by a step: open)
        for dtype in (ml_dtypes.bfloat16, np.float16):
            xs = (x * np.float32(scale)).astype(dtype)
            got = backend.quantize_activations(xs)
            want = emu.quantize_activations(xs, deviations=["ct_encode_global"])
            np.testing.assert_array_equal(got.codes, want.codes)
            np.testing.assert_array_equal(got.scales, want.scales)
            assert float(got.global_scale) == float(want.global_scale)
            ref = reference.quantize_activations(xs)
            differs += float(got.global_scale) != float(ref.global_scale)
            differs += not np.array_equal(got.scales, ref.scales)
    assert differs > 0
