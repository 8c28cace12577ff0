"""The ``torchao`` adapter: torchao's NVFP4Tensor (to / from, weight-only linear) against the
reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    assert_dequantize_within_one_ulp,
    assert_quantizer_matches_the_reference,
    rel_error,
    weight,
)
from nvfp4 import reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.tolerances import tolerance


def test_dequantize_float32_within_one_ulp(backend) -> None:
    assert_dequantize_within_one_ulp(backend, "gate_up")


def test_weight_only_linear_float32_within_the_spec(backend, rng) -> None:
    p = fuse([weight(24, 256, 4), weight(16, 256, 5, 7.0)], "gate_up")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    y = backend.to_numpy(backend.qmm(x, p))
    assert rel_error(y, reference.qmm(x, p, out_dtype=None)) <= tolerance("qmm", "float32")


def test_quantizer_matches_the_reference_bit_for_bit(backend, rng) -> None:
    assert_quantizer_matches_the_reference(backend, rng, global_maxulp=0)


def test_what_torchao_lacks_on_cpu_is_absent(backend) -> None:
    for verb in ("gather_qmm", "qmm_w4a4", "qmm_w4a8"):
        assert not backend.has(verb)
    p = stack_experts([weight(8, 64, 6), weight(8, 64, 7)], "moe")
    with pytest.raises(NotImplementedError, match=r"torchao.*no gather_qmm kernel"):
        backend.gather_qmm(np.ones((1, 64), np.float32), p, np.array([0], np.int32))
