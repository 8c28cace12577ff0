"""The ``modelopt`` adapter: ModelOpt's NVFP4QTensor quantize / dequantize against the
reference."""

from __future__ import annotations

import numpy as np
from conftest import (
    assert_dequantize_is_emulated,
    assert_dequantize_within_one_ulp,
    assert_has_no_matmul,
    assert_quantizer_matches_the_reference,
    fused_and_stacked,
)
from nvfp4 import reference


def test_dequantize_float32_within_one_ulp_float16_in_its_dtype(backend) -> None:
    assert_dequantize_within_one_ulp(backend, "gate_up")
    for p in fused_and_stacked("gate_up"):
        assert backend.to_numpy(backend.dequantize(p, "float16")).dtype == np.float16


def test_quantizer_matches_the_reference_bit_for_bit(backend, rng) -> None:
    assert_quantizer_matches_the_reference(backend, rng, global_maxulp=0)


def test_static_input_scale_is_modelopts_weight_scale_2(backend, rng) -> None:
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=0.0025)
    assert float(got.global_scale) == np.float32(0.0025)
    assert np.array_equal(got.scales, reference.quantize_activations(x, 0.0025).scales)


def test_what_modelopt_lacks_on_cpu_is_absent(backend) -> None:
    assert_has_no_matmul(backend)


def test_dequantize_is_the_emulated_scale_times_global_first(backend) -> None:
    """nvfp4.deviation_emulators' scale_times_global_first is what ModelOpt computes: equal
    values for float32, float16 and bfloat16 over random weights, where the plain reference
    differs for float32."""
    w, got = assert_dequantize_is_emulated(backend, "scale_times_global_first", seed=11)
    assert not np.array_equal(got, reference.dequantize(w))
