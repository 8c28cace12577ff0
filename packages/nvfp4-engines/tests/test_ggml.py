"""The ``ggml`` adapter: ggml-cpu's NVFP4 decode, Q8_0 quantizer and W4A8 matmuls against
the reference (spec 1.1)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import weight
from nvfp4 import PlaneError, get_backend, reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.tolerances import tolerance


@pytest.fixture(scope="module")
def backend():
    return get_backend("ggml")


def _rel(y, ref) -> float:
    return float(np.abs(np.asarray(y, np.float64) - ref).max() / np.abs(ref).max())


def test_declares_w4a8_not_w4a16(backend) -> None:
    assert "w4a8" in backend.info.capabilities
    assert "qmm" not in backend.info.capabilities
    assert not backend.has("qmm")


def test_dequantize_exact_with_partitions_and_experts(backend) -> None:
    fused = fuse([weight(8, 64, 0, 0.01), weight(8, 64, 1, 50.0)], "qk")
    stack = stack_experts([weight(8, 128, 2), weight(8, 128, 3, 3.0)], "moe")
    for p in (fused, stack):
        assert np.array_equal(backend.dequantize(p), reference.dequantize(p))


def test_q8_quantizer_matches_the_reference(backend, rng) -> None:
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations_q8(x), reference.quantize_activations_q8(x)
    assert np.array_equal(got.d.view(np.uint16), ref.d.view(np.uint16))
    assert np.array_equal(got.codes, ref.codes)


def test_qmm_w4a8_within_the_spec(backend, rng) -> None:
    p = fuse([weight(24, 256, 4), weight(16, 256, 5, 7.0)], "gate_up")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    y = backend.qmm_w4a8(x, p)
    assert _rel(y, reference.qmm_w4a8(x, p, out_dtype=None)) <= tolerance("w4a8", "float32")


def test_gather_qmm_w4a8_in_range_and_refused_out_of_range(backend, rng) -> None:
    p = stack_experts([weight(16, 64, 6), weight(16, 64, 7, 4.0)], "moe")
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids = np.array([1, 0, 0, 1, 1], np.int32)
    y = backend.gather_qmm_w4a8(x, p, ids)
    ref = reference.gather_qmm_w4a8(x, p, ids, out_dtype=None)
    assert _rel(y, ref) <= tolerance("w4a8", "float32")
    with pytest.raises(ValueError, match=r"expert id -1 at row 0 is outside \[0, 2\)"):
        backend.gather_qmm_w4a8(x[:1], p, np.array([-1], np.int32))


def test_quantizer_is_ggmls_with_global_one(backend, rng) -> None:
    x = rng.standard_normal((3, 128)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=1.0)
    ref = reference.quantize_activations(x, 1.0)
    assert float(got.global_scale) == 1.0
    assert np.array_equal(got.scales, ref.scales)  # normal data: the spec's scale bytes
    with pytest.raises(PlaneError, match=r"'activation'.*multiple of 64.*K = 48"):
        backend.quantize_activations(x[:, :48])
