"""T2 quantize, W4A8 (spec 1.1): the backend's activation encoders against the reference's.

* int8 (``quantize_activations_q8``, capability ``w4a8``): ``d`` (float16, NaN for a block
  holding NaN or Inf) bit-identical; codes equal except boundary disagreements (a code one
  away where the reference's ``|x * id|`` lies within ``boundary_window`` of the midpoint of
  the two codes, exact midpoints included: ggml's half-to-even SIMD paths conform), whose
  fraction over the random float32 corpus (2^20 elements and more) is within
  ``[quantize_q8] others`` (``reference`` = 0 for the reference backend); a non-finite block
  has zero codes.
* FP8 (``quantize_activations_fp8``, capability ``w4a8_fp8``): codes and the dynamic input
  scale bit-identical.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import reference
from nvfp4.activations import Q8Activations
from nvfp4.testing import (
    nonfinite_blocks,
    q8_exact_halves,
    rows_across_magnitudes,
    scattered_inf,
    zero_blocks,
)

from nvfp4_conformance.checks import is_reference
from nvfp4_conformance.corpus import CorpusTally
from nvfp4_conformance.w4a8_encoders import compare_fp8, compare_q8

pytestmark = pytest.mark.min_spec("1.1")


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _q8(backend: Any, x: npt.NDArray[Any]) -> tuple[Q8Activations, Q8Activations]:
    return backend.quantize_activations_q8(
        backend.from_numpy(x)
    ), reference.quantize_activations_q8(x)


Builder = Callable[[np.random.Generator], npt.NDArray[Any]]
Q8_CASES: dict[str, Builder] = {
    "exact_halves": lambda r: q8_exact_halves(r, 8, 256),
    "normal_m1_k4096": lambda r: r.standard_normal((1, 4096)).astype(np.float32),
    "normal_m33_k288": lambda r: r.standard_normal((33, 288)).astype(np.float32),
    "rows_1e-30_to_1e30": lambda r: rows_across_magnitudes(r, 7, 128, -30, 30),
    "d_overflows_float16": lambda r: (r.standard_normal((2, 64)) * 1e8).astype(np.float32),
    "d_underflows_float16": lambda r: (r.standard_normal((2, 64)) * 1e-9).astype(np.float32),
    "zeros": lambda r: np.zeros((3, 64), np.float32),
    "zero_blocks": lambda r: zero_blocks(r, 5, 128),
    "nonfinite_blocks": lambda r: nonfinite_blocks(r, 6, 128, 0.02),
    "float16_input": lambda r: r.standard_normal((16, 1024)).astype(np.float16),
    "bfloat16_input": lambda r: r.standard_normal((16, 1024)).astype(ml_dtypes.bfloat16),
}


@pytest.mark.requires_capability("w4a8")
@pytest.mark.parametrize("case", list(Q8_CASES))
def test_quantize_activations_q8(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, case: str
) -> None:
    """Crafted cases: exact halves, rows from 1e-30 to 1e30, d beyond float16 (infinite) and
    below it (zero or subnormal), zeros, zero blocks, NaN/Inf blocks, float16 / bfloat16."""
    x = Q8_CASES[case](_rng(case))
    got, ref = _q8(nvfp4_backend, x)
    exact = is_reference(nvfp4_backend)
    figures = compare_q8(x, got, ref, window=nvfp4_tolerance("quantize_q8", "boundary_window"))
    nvfp4_record(case, shape=list(x.shape), **figures)
    if exact:
        assert figures["disagreements"] == 0, "the reference backend must agree everywhere"


@pytest.mark.requires_capability("w4a8")
def test_quantize_activations_q8_random_corpus(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """2^20 and more random float32 activations: boundary disagreements only, their fraction
    within ``[quantize_q8] others`` (``reference``, 0, for the reference backend)."""
    exact = is_reference(nvfp4_backend)
    window = nvfp4_tolerance("quantize_q8", "boundary_window")
    tally = CorpusTally()
    for name, shape in (("normal_256x4096", (256, 4096)), ("heavy_64x1024", (64, 1024))):
        rng = _rng(name)
        if name.startswith("heavy"):
            x = rng.standard_t(3, size=shape).astype(np.float32)
        else:
            x = rng.standard_normal(shape) * np.exp(rng.normal(0.0, 1.0, size=(shape[0], 1)))
            x = x.astype(np.float32)
        got, ref = _q8(nvfp4_backend, x)
        figures = compare_q8(x, got, ref, window=window)
        tally.add(figures)
        nvfp4_record(name, shape=list(shape), **figures)
    tally.judge(nvfp4_record, nvfp4_tolerance, table="quantize_q8", exact=exact, unit="int8 codes")


@pytest.mark.requires_capability("w4a8")
def test_quantize_activations_q8_refuses_k_not_multiple_of_32(nvfp4_backend: Any) -> None:
    x = np.ones((2, 48), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        nvfp4_backend.quantize_activations_q8(nvfp4_backend.from_numpy(x))


FP8_CASES: dict[str, tuple[Builder, float | None]] = {
    "normal_dynamic": (lambda r: r.standard_normal((33, 512)).astype(np.float32), None),
    "normal_static": (lambda r: r.standard_normal((8, 256)).astype(np.float32), 0.01),
    "saturating_static": (lambda r: (r.standard_normal((4, 128)) * 100).astype(np.float32), 0.05),
    "subnormal_codes": (lambda r: (r.standard_normal((4, 128)) * 1e-3).astype(np.float32), 1.0),
    "e4m3_ties": (
        lambda r: (r.integers(8, 64, size=(4, 128)) * 2.0 + 1.0).astype(np.float32) / 16,
        1.0,
    ),
    "zeros": (lambda r: np.zeros((3, 64), np.float32), None),
    "nonfinite": (lambda r: scattered_inf(r, 5, 96, 0.02), None),
    "bfloat16_input": (lambda r: r.standard_normal((16, 512)).astype(ml_dtypes.bfloat16), None),
}


@pytest.mark.requires_capability("w4a8_fp8")
@pytest.mark.parametrize("case", list(FP8_CASES))
def test_quantize_activations_fp8(nvfp4_backend: Any, nvfp4_record: Any, case: str) -> None:
    """FP8 E4M3 codes and the dynamic input scale equal the reference's, bit for bit:
    saturation at 448, subnormal codes, E4M3 ties, zeros, NaN/Inf, bfloat16 input."""
    build, input_scale = FP8_CASES[case]
    x = build(_rng(case))
    got = nvfp4_backend.quantize_activations_fp8(nvfp4_backend.from_numpy(x), input_scale)
    ref = reference.quantize_activations_fp8(x, input_scale)
    figures, problem = compare_fp8(x, got, ref)
    nvfp4_record(case, shape=list(x.shape), dynamic=input_scale is None, **figures)
    assert not problem, problem
