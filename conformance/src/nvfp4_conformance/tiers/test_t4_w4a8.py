"""T4 matmul, W4A8 (spec 1.1, "W4A8"): ``qmm_w4a8``, ``gather_qmm_w4a8`` (int8 activations,
capability ``w4a8``) and ``qmm_w4a8_fp8`` (FP8 activations, capability ``w4a8_fp8``) against
the float64 reference computed on the same activation codes: the backend's own when it has
the encoder (judged in T2), else the reference's. ``max|y - ref| / max|ref|`` within
``[w4a8]`` / ``[w4a8_fp8]`` per output dtype; NaN/Inf rows non-finite and the other rows
unaffected; zero rows exactly zero; out-of-range expert ids exactly zero rows, never read.
Each case also records, for information, W4A8's quantization error against W4A16.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import reference
from nvfp4.activations import Q8Activations
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import activations, relative_error, unit_scale_planes

from nvfp4_conformance.calls import (
    call_prepared,
    call_verb,
    check_qmm,
    check_rows,
    floor_of,
    own_encoding,
)
from nvfp4_conformance.cases import case_rng, nonfinite_rows_case, realistic_weight
from nvfp4_conformance.checks import as_float64, record_within
from nvfp4_conformance.sizing import matmul_params

pytestmark = pytest.mark.min_spec("1.1")

DTYPES = list(OUTPUT_DTYPES)

#: (M, K, N), K a multiple of 32; N of 1, 7, 13, 129 (not multiples of 8 or 16) included.
#: The GPU-sized ones run under the Triton interpreter as their stand-ins
#: (:mod:`nvfp4_conformance.sizing`).
SHAPES = [
    (1, 32, 1),
    (1, 4096, 256),
    (2, 64, 7),
    (3, 4096, 24),
    (8, 288, 40),
    (16, 1024, 129),
    (33, 512, 13),
    (64, 2048, 24),
    (300, 4096, 56),
]


Expected = tuple[npt.NDArray[np.float64], Any]


def q8_reference(backend: Any, x: npt.NDArray[Any], w: NVFP4Planes) -> Expected:
    """W4A8 int8 in float64 on the backend's own int8 activations (or the reference's), and
    those activations (what the path multiplies: the accumulation floor's ``a``)."""
    xq = own_encoding(backend, "quantize_activations_q8", x)
    return reference.w4a8_from_activations(xq, w), xq


def fp8_reference(
    backend: Any, x: npt.NDArray[Any], w: NVFP4Planes, scale: float | None
) -> Expected:
    """W4A8 FP8 in float64 on the backend's own FP8 activations (or the reference's), and
    those activations."""
    xq = own_encoding(backend, "quantize_activations_fp8", x, scale)
    return reference.w4a8_fp8_from_activations(xq, w), xq


def _vs_w4a16(ref: npt.NDArray[np.float64], x: npt.NDArray[Any], w: NVFP4Planes) -> float:
    return float(relative_error(ref, reference.qmm(x, w, out_dtype=None)))


# ------------------------------------------------------------------------------ int8
@pytest.mark.requires_capability("w4a8")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "k", "n"), matmul_params(SHAPES, gpu_sized={"M1_K4096_N256", "M300_K4096_N56"})
)
def test_qmm_w4a8(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, m: int, k: int, n: int, dtype: str
) -> None:
    rng = case_rng("w4a8", m, k, n)
    planes = realistic_weight(rng, n, k, name=f"t4.w4a8_{n}x{k}")
    x = activations(rng, m, k, dtype)
    ref, xq = q8_reference(nvfp4_backend, x, planes)
    check_qmm(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "qmm_w4a8",
        f"M{m}_K{k}_N{n}",
        x,
        planes,
        ref,
        dtype,
        what=f"M={m} K={k} N={n}",
        for_information={"w4a8_vs_w4a16": _vs_w4a16(ref, x, planes)},
        a=xq,
    )


@pytest.mark.requires_capability("w4a8")
@pytest.mark.requires_capability("fused_partitions")
@pytest.mark.parametrize("dtype", DTYPES)
def test_qmm_w4a8_fused_partitions(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, dtype: str
) -> None:
    """q/k/v partitions with globals 100x apart: each applied to its own rows."""
    rng = case_rng("w4a8_fused")
    parts = (0, 64, 80, 96)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    w[64:80] *= 100.0
    planes = reference.quantize(w, partitions=parts, name="t4.w4a8_qkv")
    x = activations(rng, 5, 256, dtype)
    ref, xq = q8_reference(nvfp4_backend, x, planes)
    y = call_prepared(nvfp4_backend, "qmm_w4a8", x, planes, shape=(5, 96), dtype=dtype)
    tol = float(nvfp4_tolerance("w4a8", dtype))
    floor = floor_of(nvfp4_tolerance, "w4a8", xq, planes, ref, dtype)
    for a, b in itertools.pairwise(parts):
        rows = f"partition rows {a}..{b - 1}"
        record_within(
            nvfp4_record,
            rows,
            y[:, a:b],
            ref[:, a:b],
            tol,
            f"qmm_w4a8 {rows}",
            allowance=None if floor is None else floor[:, a:b],
            dtype=dtype,
        )


GATHER = [("e4_m33_k256_n40", 4, 33, 256, 40), ("e3_m1_k1024_n7", 3, 1, 1024, 7)]


@pytest.mark.requires_capability("w4a8")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize(("label", "e", "m", "k", "n"), GATHER, ids=[g[0] for g in GATHER])
def test_gather_qmm_w4a8(
    nvfp4_backend: Any,
    nvfp4_record: Any,
    nvfp4_tolerance: Any,
    label: str,
    e: int,
    m: int,
    k: int,
    n: int,
    sort: bool,
    dtype: str,
) -> None:
    """Per-expert globals 1000x apart, ids out of range on both sides (exactly zero rows)."""
    rng = case_rng("gather_w4a8", label)
    wf = rng.standard_normal((e, n, k)).astype(np.float32)
    wf *= np.logspace(-1.5, 1.5, e, dtype=np.float32)[:, None, None]
    planes = reference.quantize(wf, name=f"t4.gather_w4a8_{label}")
    x = activations(rng, m, k, dtype)
    ids = rng.integers(-1, e + 1, size=m).astype(np.int64)
    ids[0] = e - 1
    if sort:
        ids = np.sort(ids)
    y = call_prepared(
        nvfp4_backend,
        "gather_qmm_w4a8",
        x,
        planes,
        nvfp4_backend.from_numpy(ids),
        shape=(m, n),
        dtype=dtype,
        sorted_indices=sort,
    )
    # int8 activations are per row: x is encoded once, whatever rows are routed together
    xq = own_encoding(nvfp4_backend, "quantize_activations_q8", x)
    ref = np.zeros((m, n), dtype=np.float64)
    valid = (ids >= 0) & (ids < e)
    for expert in np.unique(ids[valid]):
        rows = ids == expert
        we = NVFP4Planes(
            planes.codes[expert], planes.scales[expert], planes.global_scale[expert], name="e"
        )
        routed = Q8Activations(codes=xq.codes[rows], d=xq.d[rows], name=xq.name)
        ref[rows] = reference.w4a8_from_activations(routed, we)
    outside = as_float64(y)[~valid]
    assert (outside == 0).all(), "rows with an out-of-range expert id must be exactly zero"
    tol = float(nvfp4_tolerance("w4a8", dtype))
    record_within(
        nvfp4_record,
        label,
        y,
        ref,
        tol,
        f"gather_qmm_w4a8 {label} {dtype}",
        allowance=floor_of(nvfp4_tolerance, "w4a8", xq, planes, ref, dtype, ids),
        dtype=dtype,
        sorted=sort,
    )


@pytest.mark.requires_capability("w4a8")
def test_gather_qmm_w4a8_out_of_range_rows_not_read(nvfp4_backend: Any) -> None:
    """A NaN/Inf row whose id is out of range still gives exactly zero."""
    rng = case_rng("gather_w4a8_nan")
    planes = reference.quantize(rng.standard_normal((2, 8, 64)).astype(np.float32))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1] = np.nan
    x[3] = np.inf
    ids = np.array([0, -1, 1, 2], dtype=np.int64)
    y = call_verb(
        nvfp4_backend,
        "gather_qmm_w4a8",
        x,
        nvfp4_backend.prepare(planes),
        nvfp4_backend.from_numpy(ids),
    )
    assert (as_float64(y)[[1, 3]] == 0).all(), "out-of-range rows must be exactly zero"
    assert np.isfinite(as_float64(y)[[0, 2]]).all()


def _check_nonfinite_rows(
    backend: Any,
    record: Any,
    tolerance: Any,
    tag: str,
    inf: float,
    reference_of: Callable[[Any, npt.NDArray[Any], NVFP4Planes], Expected],
) -> None:
    """``qmm_<tag>`` on x with NaN in row 1, ``inf`` in row 4 and a zero row 5: those rows
    give NaN and exactly zero, rows 0, 2 and 3 stay within ``[<tag>] float32`` of
    ``reference_of(backend, x, planes)``."""
    planes, x = nonfinite_rows_case(tag, inf)
    x[5] = 0.0
    y = call_prepared(backend, f"qmm_{tag}", x, planes, shape=(6, 16), dtype="float32")
    assert np.isnan(y[[1, 4]]).all(), "rows holding NaN/Inf in x must give NaN outputs"
    assert (y[5] == 0).all(), "a zero row of x must give an exactly zero output row"
    good = np.array([0, 2, 3])
    ref, a = reference_of(backend, x, planes)
    what = f"qmm_{tag} finite rows next to non-finite ones"
    check_rows(record, tolerance, tag, "nonfinite_rows", y, ref, good, what, a=a, planes=planes)


@pytest.mark.requires_capability("w4a8")
def test_qmm_w4a8_nonfinite_and_zero_rows(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """NaN / Inf in a row: that row's outputs are NaN, the others unaffected; a zero row
    gives exactly zero."""
    _check_nonfinite_rows(
        nvfp4_backend, nvfp4_record, nvfp4_tolerance, "w4a8", np.inf, q8_reference
    )


def _signed_blocks(k: int, n: int) -> NVFP4Planes:
    """``[n, k]`` weights of +-1.0 (codes 2 / 10, scale byte 0x38, global 1): row 0 all +1,
    row 1 +1 then -1 in its second 16-element block, the others random signs."""
    codes = np.full((n, k), 2, np.uint8)
    codes[1, 16:32] = 10
    rng = case_rng("w4a8_infinite_d", k, n)
    codes[2:] = np.where(rng.random((n - 2, k)) < 0.5, 2, 10)
    return unit_scale_planes(codes, name="t4.w4a8_signed_blocks")


@pytest.mark.requires_capability("w4a8")
def test_qmm_w4a8_rows_with_an_infinite_d(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """A finite block past 127 x 65504 has ``d = inf`` (float16). Spec 1.1's terms are per
    16-element weight block, ``isum_j * (e4m3 / 2) * d``: row 1 of x (its first block all
    1e10) gives +inf against the all-positive weight row and NaN against the row whose two
    blocks have opposite signs (+inf and -inf terms); each output of the infinite rows is
    the reference's, NaN or an infinity of the same sign, and the finite rows stay within
    ``[w4a8]``. An implementation that adds two blocks' terms before ``d`` fails here."""
    m, k, n = 4, 64, 9
    planes = _signed_blocks(k, n)
    x = activations(case_rng("w4a8_infinite_d", m, k, n), m, k, "float32")
    x[1, :32] = 1e10
    x[2, 32:48] = -3e12  # half a block: d = inf in block 1, codes 0 in its other half
    y = call_prepared(nvfp4_backend, "qmm_w4a8", x, planes, shape=(m, n), dtype="float32")
    ref, xq = q8_reference(nvfp4_backend, x, planes)
    assert ref[1, 0] == np.inf, "the case itself: both terms +inf"
    assert np.isnan(ref[1, 1]), "the case itself: a +inf and a -inf term"
    for r in (1, 2):
        got, want = as_float64(y)[r], ref[r]
        assert np.array_equal(np.isnan(got), np.isnan(want)), (
            f"row {r} with an infinite d: NaN at {np.flatnonzero(np.isnan(got)).tolist()}, "
            f"expected at {np.flatnonzero(np.isnan(want)).tolist()}"
        )
        inf = np.isinf(want)
        assert np.array_equal(got[inf], want[inf]), f"row {r}: infinities differ from the terms'"
        assert not np.isinf(got[~inf]).any(), f"row {r}: an infinity where the terms give NaN"
    what = "qmm_w4a8 finite rows next to rows with an infinite d"
    good = np.array([0, 3])
    check_rows(
        nvfp4_record, nvfp4_tolerance, "w4a8", "infinite_d", y, ref, good, what, a=xq, planes=planes
    )


@pytest.mark.requires_capability("w4a8")
def test_qmm_w4a8_refuses_k_not_multiple_of_32(nvfp4_backend: Any) -> None:
    planes = reference.quantize(np.ones((4, 48), np.float32), name="t4.w4a8_k48")
    with pytest.raises(ValueError, match="multiple of 32"):
        nvfp4_backend.qmm_w4a8(
            nvfp4_backend.from_numpy(np.ones((2, 48), np.float32)), nvfp4_backend.prepare(planes)
        )


# ------------------------------------------------------------------------------- FP8
FP8 = [
    ("M1_K4096_N24_dynamic", 1, 4096, 24, None),
    ("M33_K512_N7_dynamic", 33, 512, 7, None),
    ("M300_K1024_N56_dynamic", 300, 1024, 56, None),
    ("M16_K272_N40_static", 16, 272, 40, "static"),
    ("M8_K256_N13_static_saturating", 8, 256, 13, "saturating"),
]


@pytest.mark.requires_capability("w4a8_fp8")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("label", "m", "k", "n", "scale"),
    matmul_params(FP8, gpu_sized={"M300_K1024_N56_dynamic"}, labelled=True),
)
def test_qmm_w4a8_fp8(
    nvfp4_backend: Any,
    nvfp4_record: Any,
    nvfp4_tolerance: Any,
    label: str,
    m: int,
    k: int,
    n: int,
    scale: str | None,
    dtype: str,
) -> None:
    """Dynamic input scale (amax / 448), a static one above it, and a static one that
    saturates the largest activations at 448."""
    rng = case_rng("w4a8_fp8", label)
    planes = realistic_weight(rng, n, k, name=f"t4.w4a8_fp8_{label}")
    x = activations(rng, m, k, dtype)
    amax = float(np.abs(as_float64(x)).max())
    input_scale = None
    if scale == "static":
        input_scale = amax / 448 * 1.5
    elif scale == "saturating":
        input_scale = amax / 448 / 4
    ref, xq = fp8_reference(nvfp4_backend, x, planes, input_scale)
    check_qmm(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "qmm_w4a8_fp8",
        label,
        x,
        planes,
        ref,
        dtype,
        for_information={"w4a8_vs_w4a16": _vs_w4a16(ref, x, planes)},
        figures={"input_scale_policy": "dynamic" if input_scale is None else "static"},
        a=xq,
        input_scale=input_scale,
    )


@pytest.mark.requires_capability("w4a8_fp8")
def test_qmm_w4a8_fp8_nonfinite_and_zero_rows(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    _check_nonfinite_rows(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "w4a8_fp8",
        -np.inf,
        lambda backend, x, planes: fp8_reference(backend, x, planes, None),
    )
