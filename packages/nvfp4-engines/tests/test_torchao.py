"""The ``torchao`` adapter: torchao's NVFP4Tensor (to / from, weight-only linear) against the
reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import weight
from nvfp4 import get_backend, reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.tolerances import tolerance


@pytest.fixture(scope="module")
def backend():
    return get_backend("torchao")


def _rel(y, ref) -> float:
    return float(np.abs(np.asarray(y, np.float64) - ref).max() / np.abs(ref).max())


def test_dequantize_float32_within_one_ulp(backend) -> None:
    fused = fuse([weight(8, 64, 0, 0.01), weight(16, 64, 1, 50.0)], "gate_up")
    stack = stack_experts([weight(8, 32, 2), weight(8, 32, 3, 4.0)], "experts")
    for p in (fused, stack):
        got = backend.to_numpy(backend.dequantize(p, "float32"))
        # torchao multiplies scale by per_tensor_scale first, then by the code
        np.testing.assert_array_max_ulp(got, reference.dequantize(p), maxulp=1)


def test_weight_only_linear_float32_within_the_spec(backend, rng) -> None:
    p = fuse([weight(24, 256, 4), weight(16, 256, 5, 7.0)], "gate_up")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    y = backend.to_numpy(backend.qmm(x, p))
    assert _rel(y, reference.qmm(x, p, out_dtype=None)) <= tolerance("qmm", "float32")


def test_quantizer_matches_the_reference_bit_for_bit(backend, rng) -> None:
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations(x), reference.quantize_activations(x, None)
    assert got.global_scale.tobytes() == ref.global_scale.tobytes()
    assert np.array_equal(got.scales, ref.scales)
    assert np.array_equal(got.codes, ref.codes)


def test_what_torchao_lacks_on_cpu_is_absent(backend) -> None:
    for verb in ("gather_qmm", "qmm_w4a4", "qmm_w4a8"):
        assert not backend.has(verb)
    p = stack_experts([weight(8, 64, 6), weight(8, 64, 7)], "moe")
    with pytest.raises(NotImplementedError, match=r"torchao.*no gather_qmm kernel"):
        backend.gather_qmm(np.ones((1, 64), np.float32), p, np.array([0], np.int32))
