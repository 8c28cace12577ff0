"""T4 matmul: ``qmm``, ``gather_qmm`` (MoE), fused-partition globals and W4A4 against the
float64 reference (:func:`nvfp4.reference.qmm` with ``out_dtype=None``: exactly decoded
weights, float64 accumulation, the global applied once after accumulation).

The error measure is spec 1.0's: ``max|y - ref| / max|ref|`` per output dtype, against
``nvfp4.tolerances.tolerance(path, dtype, spec=<the certified version>)``
(``spec/<v>/tolerances.toml``). Every case's
measured ``max|err|``, ``max|ref|`` and ratio go into the certificate, pass or fail. The
output dtype is x's dtype (the verbs' default). MoE rows whose expert id is outside
``[0, E)`` must be exactly zero - even when that row of ``x`` holds NaN or Inf, since the
row must not be read. One case checks directly that x keeps the precision it was given
(:func:`test_qmm_keeps_the_precision_of_x`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import reference
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import GLOBAL_AMAX_DIVISOR
from nvfp4.testing import activations, unit_scale_planes, unrouted_nonfinite_rows

from nvfp4_conformance.calls import (
    call_prepared,
    call_verb,
    check_qmm,
    check_rows,
    floor_of,
    own_encoding,
)
from nvfp4_conformance.cases import case_rng, nonfinite_rows_case, realistic_weight
from nvfp4_conformance.checks import as_float64, assert_within, error_figures, record_within
from nvfp4_conformance.sizing import matmul_params

DTYPES = list(OUTPUT_DTYPES)

#: (M, K, N): every M of the issue, K up to 4096, N of 1, 7, 24 and others that are not a
#: multiple of 16 (or of 8).
QMM_SHAPES = [
    (1, 16, 1),
    (1, 4096, 256),
    (2, 64, 7),
    (2, 2048, 9),
    (3, 4096, 24),
    (8, 272, 40),
    (8, 1024, 100),
    (16, 64, 8),
    (16, 1024, 129),
    (33, 512, 7),
    (33, 4096, 13),
    (64, 128, 1),
    (64, 2048, 24),
    (300, 64, 1),
    (300, 4096, 56),
]


def _partition_groups(planes: NVFP4Planes, rows: Any = slice(None)) -> dict[str, Any]:
    if planes.partitions is None:
        return {}
    g = np.asarray(planes.global_scale).reshape(-1)
    return {
        f"partition {i} (rows {a}..{b - 1})": ((rows, slice(a, b)), float(g[i]))
        for i, (a, b) in enumerate(itertools.pairwise(planes.partitions))
    }


# ------------------------------------------------------------------------------- qmm
@pytest.mark.requires_capability("qmm")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "k", "n"), QMM_SHAPES, ids=[f"M{m}_K{k}_N{n}" for m, k, n in QMM_SHAPES]
)
def test_qmm(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, m: int, k: int, n: int, dtype: str
) -> None:
    rng = case_rng("qmm", m, k, n)
    planes = realistic_weight(rng, n, k, name=f"t4.qmm_{n}x{k}")
    x = activations(rng, m, k, dtype)
    backend = (nvfp4_backend, nvfp4_record, nvfp4_tolerance)
    check_plain_qmm(backend, f"M{m}_K{k}_N{n}", x, planes, dtype, f"M={m} K={k} N={n}")


def check_plain_qmm(
    backend: tuple[Any, Any, Any], case: str, x: Any, planes: NVFP4Planes, dtype: str, what: str
) -> None:
    """``qmm`` of one global against the float64 reference (``backend``: the suite's
    backend, record and tolerance fixtures)."""
    ref = reference.qmm(x, planes, out_dtype=None)
    check_qmm(*backend, "qmm", case, x, planes, ref, dtype, what=what)


def pass_through(k: int, n: int) -> NVFP4Planes:
    """``[n, k]`` planes (``n <= k``) whose row ``j`` is 1.0 at column ``j`` and 0 elsewhere
    (code 2 = 1.0, scale byte 0x38 = 1.0, global 1): ``y[m, j] = x[m, j]`` exactly, one
    product and zeros, in any order of accumulation."""
    codes = np.zeros((n, k), np.uint8)
    codes[np.arange(n), np.arange(n)] = 2
    return unit_scale_planes(codes, name="t4.pass_through")


def x_finer_than_narrower_types(rng: np.random.Generator, m: int, k: int, dtype: str) -> Any:
    """``[m, k]`` activations in ``dtype`` that every narrower type changes by more than the
    tolerance: float32 values ``1 + 2^-12 + j 2^-20`` (j < 128), which float16 and TF32 (10
    mantissa bits) and bfloat16 round by at least 2^-12 (2.4e-4 of max|ref|, against
    1e-4); float16 values ``1 + (2j + 1) 2^-9`` (j < 16), which bfloat16 rounds by 2^-9
    (1.8e-3 of max|ref|, against 1e-3); bfloat16 values ``2^20 (1 + j 2^-7)``, past float16's
    range (65504). Random signs."""
    j = rng.integers(0, 128 if dtype == "float32" else 16, (m, k))
    if dtype == "float32":
        mag = 1.0 + 2.0**-12 + j * 2.0**-20
    elif dtype == "float16":
        mag = 1.0 + (2 * j + 1) * 2.0**-9
    else:
        mag = 2.0**20 * (1.0 + j * 2.0**-7)
    x = np.where(rng.random((m, k)) < 0.5, -mag, mag)
    out = x.astype(OUTPUT_DTYPES[dtype])
    assert np.array_equal(out.astype(np.float64), x), "the values must be exact in dtype"
    return out


@pytest.mark.requires_capability("qmm")
@pytest.mark.parametrize("dtype", DTYPES)
def test_qmm_keeps_the_precision_of_x(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, dtype: str
) -> None:
    """An implementation MUST NOT round x to a type narrower than the one it was given
    (spec, "Tolerances"), tested directly: a weight that passes x through (``y = x``
    exactly) and activations every narrower type changes: float32 x through TF32 or
    float16, float16 x through bfloat16, bfloat16 x through float16 (out of its range). The
    realistic cases above catch most rounding of float32 and float16 x as well, but not
    bfloat16 x taken through float16, which changes nothing inside float16's range."""
    m, k, n = 3, 64, 24
    x = x_finer_than_narrower_types(case_rng("qmm_x_precision", m, k, n), m, k, dtype)
    backend = (nvfp4_backend, nvfp4_record, nvfp4_tolerance)
    what = f"x kept at {dtype} (M={m} K={k} N={n}, y = x)"
    check_plain_qmm(backend, "x_precision", x, pass_through(k, n), dtype, what)


FUSED = [
    ("qkv_64_16_16", (0, 64, 80, 96), 256, 5),
    ("gate_up_40_40", (0, 40, 80), 512, 33),
    ("three_uneven_7_9_1", (0, 7, 16, 17), 64, 2),
]


@pytest.mark.requires_capability("qmm")
@pytest.mark.requires_capability("fused_partitions")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("label", "parts", "k", "m"), FUSED, ids=[f[0] for f in FUSED])
def test_qmm_fused_partitions(
    nvfp4_backend: Any,
    nvfp4_record: Any,
    nvfp4_tolerance: Any,
    label: str,
    parts: tuple[int, ...],
    k: int,
    m: int,
    dtype: str,
) -> None:
    """A fused q/k/v (gate/up) weight keeps one global per partition, applied to its rows."""
    rng = case_rng("fused", label)
    planes = realistic_weight(rng, parts[-1], k, partitions=parts, name=f"t4.{label}")
    assert len(set(np.asarray(planes.global_scale).tolist())) == len(parts) - 1
    x = activations(rng, m, k, dtype)
    ref = reference.qmm(x, planes, out_dtype=None)
    y = call_prepared(
        nvfp4_backend, "qmm", x, planes, shape=(m, parts[-1]), dtype=dtype, what="qmm (fused)"
    )
    tol = float(nvfp4_tolerance("qmm", dtype))
    record_within(
        nvfp4_record,
        label,
        y,
        ref,
        tol,
        f"qmm fused {label} {dtype}",
        groups=_partition_groups(planes),
        allowance=floor_of(nvfp4_tolerance, "qmm", x, planes, ref, dtype),
        dtype=dtype,
        shape=[m, k, parts[-1]],
    )


# ------------------------------------------------------------------------ gather_qmm
def _ids(
    rng: np.random.Generator, m: int, e: int, *, sort: bool, out_of_range: bool
) -> npt.NDArray[np.int64]:
    ids = rng.integers(0, e, size=m)
    if out_of_range and m >= 3:
        where = rng.choice(m, size=max(1, m // 8), replace=False)
        ids[where] = rng.choice([-1, e, e + 3, 1 << 20, -(1 << 20)], size=where.size)
    return np.sort(ids) if sort else ids


GATHER = [
    # label, E, M, K, N, partitions
    ("E4_M33_K256_N24", 4, 33, 256, 24, None),
    ("E8_M300_K64_N7", 8, 300, 64, 7, None),
    ("E3_M1_K512_N13", 3, 1, 512, 13, None),
    ("E2_M64_K1024_N1", 2, 64, 1024, 1, None),
    ("E6_M16_K128_N40", 6, 16, 128, 40, None),
]


def _expert_groups(planes: NVFP4Planes, ids: npt.NDArray[np.int64]) -> dict[str, Any]:
    e = planes.num_experts or 0
    g = np.asarray(planes.global_scale)
    groups: dict[str, Any] = {}
    for ex in range(e):
        rows = ids == ex
        if not rows.any():
            continue
        if planes.partitions is None:
            groups[f"expert {ex}"] = (
                (rows, slice(None)),
                float(g.reshape(-1)[ex] if g.ndim else g),
            )
        else:
            for i, (a, b) in enumerate(itertools.pairwise(planes.partitions)):
                groups[f"expert {ex} partition {i}"] = ((rows, slice(a, b)), float(g[ex, i]))
    return groups


def _check_gather(
    backend: Any,
    record: Any,
    nvfp4_tolerance: Any,
    label: str,
    planes: NVFP4Planes,
    x: npt.NDArray[Any],
    ids: npt.NDArray[Any],
    dtype: str,
    sort: bool,
) -> None:
    e = planes.num_experts
    assert e is not None
    ref = reference.gather_qmm(x, planes, ids, out_dtype=None)
    y = call_prepared(
        backend,
        "gather_qmm",
        x,
        planes,
        backend.from_numpy(ids),
        shape=(x.shape[0], planes.n),
        dtype=dtype,
        sorted_indices=sort,
    )
    oob = (ids < 0) | (ids >= e)
    tol = float(nvfp4_tolerance("gather_qmm", dtype))
    inb = ~oob
    floor = floor_of(nvfp4_tolerance, "gather_qmm", x, planes, ref, dtype, ids)
    floor_in = None if floor is None else floor[inb]
    figs = error_figures(y[inb], ref[inb], floor_in, tol)
    nonzero_oob = int(
        np.count_nonzero(as_float64(y[oob]) != 0) + np.count_nonzero(np.isnan(as_float64(y[oob])))
    )
    record(
        label + ("_sorted" if sort else "_unsorted"),
        dtype=dtype,
        shape=[x.shape[0], planes.k, planes.n],
        experts=e,
        out_of_range_rows=int(oob.sum()),
        out_of_range_nonzero=nonzero_oob,
        tolerance=tol,
        **figs,
    )
    if nonzero_oob:
        bad_rows = np.flatnonzero(
            oob & np.any((as_float64(y) != 0) | np.isnan(as_float64(y)), axis=1)
        )
        raise AssertionError(
            f"gather_qmm {label} {dtype}: rows with an out-of-range expert id must be exactly "
            f"zero; {len(bad_rows)} are not (rows {bad_rows[:8].tolist()} with expert ids "
            f"{ids[bad_rows[:8]].tolist()}, E = {e}; first row max|y| = "
            f"{float(np.nanmax(np.abs(as_float64(y[bad_rows[0]])), initial=np.nan))!r})"
        )
    assert_within(
        y[inb],
        ref[inb],
        tol,
        f"gather_qmm {label} {dtype}",
        groups=_expert_groups(planes, ids[inb]),
        allowance=floor_in,
    )


@pytest.mark.requires_capability("gather_qmm")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize(("label", "e", "m", "k", "n", "parts"), GATHER, ids=[g[0] for g in GATHER])
def test_gather_qmm(
    nvfp4_backend: Any,
    nvfp4_record: Any,
    nvfp4_tolerance: Any,
    label: str,
    e: int,
    m: int,
    k: int,
    n: int,
    parts: Any,
    sort: bool,
    dtype: str,
) -> None:
    """Per-expert globals; some expert ids out of range (-1, E, E+3, +-2^20)."""
    rng = case_rng("gather", label)
    planes = realistic_weight(rng, n, k, experts=e, partitions=parts, name=f"t4.{label}")
    x = activations(rng, m, k, dtype)
    ids = _ids(rng, m, e, sort=sort, out_of_range=True).astype(np.int32 if sort else np.int64)
    _check_gather(nvfp4_backend, nvfp4_record, nvfp4_tolerance, label, planes, x, ids, dtype, sort)


@pytest.mark.requires_capability("gather_qmm")
@pytest.mark.requires_capability("fused_partitions")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_qmm_fused_expert_partitions(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, dtype: str
) -> None:
    """Fused gate/up experts: globals ``(E, P)``, one per expert and partition."""
    rng = case_rng("gather_fused")
    planes = realistic_weight(
        rng, 32, 128, experts=3, partitions=(0, 16, 32), name="t4.moe_gate_up"
    )
    x = activations(rng, 20, 128, dtype)
    ids = _ids(rng, 20, 3, sort=False, out_of_range=True)
    _check_gather(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "E3_gate_up_16_16",
        planes,
        x,
        ids,
        dtype,
        False,
    )


@pytest.mark.requires_capability("gather_qmm")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_qmm_out_of_range_rows_not_read(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, dtype: str
) -> None:
    """Rows of x holding NaN / Inf whose expert id is out of range give exact zeros: the
    row is not computed (a masked multiply would give NaN)."""
    rng = case_rng("gather_nan")
    planes = realistic_weight(rng, 24, 64, experts=4, name="t4.moe_nan")
    x = activations(rng, 12, 64, dtype)
    ids = unrouted_nonfinite_rows(rng, x, 4)
    _check_gather(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "E4_nonfinite_out_of_range_rows",
        planes,
        x,
        ids,
        dtype,
        False,
    )


@pytest.mark.requires_capability("gather_qmm")
def test_gather_qmm_false_sorted_hint(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """``sorted_indices=True`` with ids that are not sorted: refused (ValueError) or
    ignored, never wrong rows."""
    rng = case_rng("gather_false_hint")
    planes = realistic_weight(rng, 16, 64, experts=4, name="t4.moe_hint")
    x = activations(rng, 10, 64, "float32")
    ids = np.array([3, 0, 2, 1, 3, 0, 0, 2, 1, 3], dtype=np.int64)
    try:
        y = call_verb(
            nvfp4_backend,
            "gather_qmm",
            x,
            nvfp4_backend.prepare(planes),
            nvfp4_backend.from_numpy(ids),
            sorted_indices=True,
        )
    except ValueError as exc:
        nvfp4_record("false sorted hint", behaviour="refused", message=str(exc)[:200])
        return
    ref = reference.gather_qmm(x, planes, ids, out_dtype=None)
    tol = float(nvfp4_tolerance("gather_qmm", "float32"))
    record_within(
        nvfp4_record,
        "false sorted hint",
        y,
        ref,
        tol,
        "gather_qmm with a false sorted_indices hint must not return wrong rows",
        groups=_expert_groups(planes, ids),
        allowance=floor_of(nvfp4_tolerance, "gather_qmm", x, planes, ref, "float32", ids),
        behaviour="ignored",
    )


# ----------------------------------------------------------------------------- W4A4
def w4a4_reference(
    backend: Any, x: npt.NDArray[Any], w: NVFP4Planes, input_scale: Any
) -> tuple[npt.NDArray[np.float64], NVFP4Planes]:
    """Spec 1.0's W4A4 reference: ``(decoded x @ decoded w.T) * global_x * global_w`` in
    float64, with x quantized by the backend's own activation encoder when it declares one
    (its encoder is judged in T2), else by the reference's; and those activation planes
    (what the path multiplies: the accumulation floor's ``a``)."""
    xp = own_encoding(backend, "quantize_activations", x, input_scale)
    with np.errstate(invalid="ignore"):
        return reference.w4a4_from_activations(xp, w), xp


W4A4 = [
    ("M1_K4096_N24", 1, 4096, 24, None),
    ("M33_K512_N7", 33, 512, 7, None),
    ("M300_K1024_N56", 300, 1024, 56, None),
    ("M16_K256_N40_static_input_scale", 16, 256, 40, "static"),
]


@pytest.mark.requires_capability("w4a4")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("label", "m", "k", "n", "scale"),
    matmul_params(W4A4, gpu_sized={"M300_K1024_N56"}, labelled=True),
)
def test_qmm_w4a4(
    nvfp4_backend: Any,
    nvfp4_record: Any,
    nvfp4_tolerance: Any,
    label: str,
    m: int,
    k: int,
    n: int,
    scale: Any,
    dtype: str,
) -> None:
    """Activations quantized with the block rule (dynamic global, or the checkpoint's static
    ``input_scale``), then the product of the decoded planes."""
    rng = case_rng("w4a4", label)
    planes = realistic_weight(rng, n, k, name=f"t4.w4a4_{label}")
    x = activations(rng, m, k, dtype)
    input_scale = None
    if scale == "static":
        input_scale = float(np.abs(as_float64(x)).max() / GLOBAL_AMAX_DIVISOR * 1.5)
    ref, xp = w4a4_reference(nvfp4_backend, x, planes, input_scale)
    check_qmm(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        "qmm_w4a4",
        label,
        x,
        planes,
        ref,
        dtype,
        a=xp,
        input_scale=input_scale,
    )


@pytest.mark.requires_capability("w4a4")
def test_qmm_w4a4_nonfinite_rows(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """A NaN or Inf activation makes its output row non-finite and leaves the other rows
    as they would be without it (the dynamic global ignores non-finite values)."""
    planes, x = nonfinite_rows_case("w4a4")
    y = call_prepared(nvfp4_backend, "qmm_w4a4", x, planes, shape=(6, 16), dtype="float32")
    bad = np.array([1, 4])
    good = np.array([0, 2, 3, 5])
    finite_bad = [int(r) for r in bad if np.isfinite(y[r]).all()]
    assert not finite_bad, f"rows {finite_bad} hold NaN/Inf in x but came out finite"
    ref, xp = w4a4_reference(nvfp4_backend, x, planes, None)
    what = "qmm_w4a4 finite rows next to non-finite ones"
    check_rows(
        nvfp4_record,
        nvfp4_tolerance,
        "w4a4",
        "nonfinite_rows",
        y,
        ref,
        good,
        what,
        a=xp,
        planes=planes,
    )
