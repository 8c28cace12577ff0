"""The ``mlx-native`` adapter: MLX's mode="nvfp4" ops against the reference, float32."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import rel_error, weight
from nvfp4 import reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.tolerances import tolerance


def test_dequantize_exact(backend) -> None:
    p = fuse([weight(8, 64, 0, 0.01), weight(8, 64, 1, 50.0)], "qk")
    assert np.array_equal(backend.to_numpy(backend.dequantize(p)), reference.dequantize(p))


def test_qmm_float32_within_the_spec(backend, rng) -> None:
    p = weight(40, 256, 2)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    y = backend.to_numpy(backend.qmm(x, p))
    assert rel_error(y, reference.qmm(x, p, out_dtype=None)) <= tolerance("qmm", "float32")


def test_gather_qmm_in_range_ids_within_the_spec(backend, rng) -> None:
    p = stack_experts([weight(16, 64, 3), weight(16, 64, 4, 9.0), weight(16, 64, 5)], "moe")
    x = rng.standard_normal((7, 64)).astype(np.float32)
    ids = np.array([2, 0, 1, 1, 2, 0, 1], np.int32)
    y = backend.to_numpy(backend.gather_qmm(x, p, ids))
    ref = reference.gather_qmm(x, p, ids, out_dtype=None)
    assert rel_error(y, ref) <= tolerance("gather_qmm", "float32")


def test_out_of_range_ids_are_refused_not_read(backend, rng) -> None:
    p = stack_experts([weight(8, 64, 6), weight(8, 64, 7)], "moe")
    x = rng.standard_normal((3, 64)).astype(np.float32)
    with pytest.raises(ValueError, match=r"expert id 2 at row 1 is outside \[0, 2\)"):
        backend.gather_qmm(x, p, np.array([0, 2, 1], np.int32))


def test_quantize_activations_global_bit_identical(backend, rng) -> None:
    x = rng.standard_normal((4, 128)).astype(np.float32)
    got = backend.quantize_activations(x)
    ref = reference.quantize_activations(x, None)
    assert got.global_scale.tobytes() == ref.global_scale.tobytes()
    assert np.array_equal(got.scales, ref.scales)


def test_the_encoder_is_the_emulated_negative_zero_code(backend) -> None:
    """nvfp4.deviation_emulators' mlx_negative_zero_code gives mx.quantize's planes for
    float32 x bit for bit (the plain reference differs in the codes of small negatives)."""
    from nvfp4 import deviation_emulators as emu

    x = np.random.default_rng(14).standard_normal((32, 128)).astype(np.float32)
    got = backend.quantize_activations(x)
    want = emu.quantize_activations(x, deviations=["mlx_negative_zero_code"])
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales, want.scales)
    assert float(got.global_scale) == float(want.global_scale)
    assert not np.array_equal(got.codes, reference.quantize_activations(x).codes)
