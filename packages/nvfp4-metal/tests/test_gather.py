"""gather_qmm: MLX's nvfp4 gather_qmm with the per-expert (and per-partition) global
gathered per row; sorted and unsorted ids; out-of-range ids give exact zero rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from metal_helpers import NP_DTYPES, check_close, realistic_planes, to_np
from nvfp4 import reference
from nvfp4.testing import activations, unrouted_nonfinite_rows
from nvfp4_metal import MetalBackend, ops
from nvfp4_metal.transcode import transcode

OUT_OF_RANGE = [-1, -(1 << 20), 1 << 20]


def _ids(rng: np.random.Generator, m: int, e: int, sort: bool) -> np.ndarray:
    ids = rng.integers(0, e, size=m)
    if m >= 3:
        where = rng.choice(m, size=max(1, m // 6), replace=False)
        ids[where] = rng.choice([*OUT_OF_RANGE, e, e + 3], size=where.size)
    return np.sort(ids) if sort else ids


CASES = [
    # E, M, K, N, partitions
    (4, 33, 256, 24, None),
    (8, 3, 16, 7, None),
    (3, 1, 48, 13, None),
    (6, 40, 128, 40, None),
    (3, 20, 64, 32, (0, 16, 32)),
]


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize(
    ("e", "m", "k", "n", "parts"),
    CASES,
    ids=[f"E{c[0]}_M{c[1]}_K{c[2]}_N{c[3]}" + ("_P" if c[4] else "") for c in CASES],
)
def test_gather_qmm(
    e: int, m: int, k: int, n: int, parts: tuple[int, ...] | None, sort: bool, dtype: str
) -> None:
    rng = np.random.default_rng(e * 1000 + m * 10 + k)
    p = realistic_planes(rng, n, k, experts=e, partitions=parts)
    x = activations(rng, m, k, dtype)
    ids = _ids(rng, m, e, sort)
    y = to_np(ops.gather_qmm(mx.array(x), transcode(p), mx.array(ids), sorted_indices=sort))
    assert y.shape == (m, n)
    assert y.dtype == NP_DTYPES[dtype]
    ref = reference.gather_qmm(x, p, ids, out_dtype=None)
    oob = (ids < 0) | (ids >= e)
    assert np.all(y[oob].astype(np.float32) == 0), "out-of-range rows must be exactly zero"
    check_close(y[~oob], ref[~oob], "gather_qmm", dtype, f"E{e} M{m} K{k} N{n} {parts}")
    # every expert's rows on their own (a global applied to the wrong expert shows here)
    for ex in np.unique(ids[~oob]):
        rows = ids == ex
        check_close(y[rows], ref[rows], "gather_qmm", dtype, f"expert {ex}")


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_out_of_range_rows_with_nan_and_inf_are_zero(dtype: str) -> None:
    rng = np.random.default_rng(11)
    p = realistic_planes(rng, 24, 64, experts=4)
    x = activations(rng, 12, 64, dtype)
    ids = unrouted_nonfinite_rows(rng, x, 4)
    y = to_np(ops.gather_qmm(mx.array(x), transcode(p), mx.array(ids)))
    bad = y[[2, 7, 11]].astype(np.float64)
    assert not np.isnan(bad).any(), f"rows: {bad}"
    assert np.all(bad == 0), f"rows: {bad}"
    ok = np.setdiff1d(np.arange(12), [2, 7, 11])
    ref = reference.gather_qmm(x[ok], p, ids[ok], out_dtype=None)
    check_close(y[ok], ref, "gather_qmm", dtype, "finite rows")


def test_ids_dtypes_and_refusals() -> None:
    rng = np.random.default_rng(12)
    p = realistic_planes(rng, 8, 32, experts=3, name="moe")
    w = transcode(p)
    x = rng.standard_normal((5, 32)).astype(np.float32)
    ids = np.array([2, 0, 1, 1, 2])
    ref = reference.gather_qmm(x, p, ids, out_dtype=None)
    for dt in (mx.int32, mx.int64, mx.uint32, mx.int16):
        y = to_np(ops.gather_qmm(mx.array(x), w, mx.array(ids).astype(dt)))
        check_close(y, ref, "gather_qmm", "float32", f"ids {dt}")
    # a sorted hint the (device) ids do not honour is dropped by the kernel: same result
    hinted = to_np(ops.gather_qmm(mx.array(x), w, mx.array(ids), sorted_indices=True))
    check_close(hinted, ref, "gather_qmm", "float32", "false hint on mx ids")
    b = MetalBackend()
    bw = b.prepare(p)
    with pytest.raises(ValueError, match="not sorted"):  # host ids: core refuses the hint
        b.gather_qmm(x, bw, ids, sorted_indices=True)
    with pytest.raises(ValueError, match="expert_ids"):
        b.gather_qmm(mx.array(x), bw, mx.array(ids[:4]))
    with pytest.raises(ValueError, match="expert_ids"):
        b.gather_qmm(mx.array(x), bw, mx.array(ids.astype(np.float32)))
    with pytest.raises(ValueError, match="K = 32"):
        b.gather_qmm(mx.ones((5, 16)), bw, mx.array(ids))
    with pytest.raises(ValueError, match=r"\[E, N, K\]"):
        b.gather_qmm(mx.array(x), realistic_planes(rng, 8, 32), mx.array(ids))
