"""MoE gather_qmm at every supported level against nvfp4.reference.gather_qmm (and, for
the routing both share, gather_qmm_w4a8 against its reference)."""

from __future__ import annotations

import numpy as np
import nvfp4
import pytest
from cpu_helpers import check_close, check_gather, expert_stack
from nvfp4 import reference
from nvfp4_cpu import CPUBackend

#: (verb, M, N, K): W4A8's K a multiple of 32.
_GATHER_SHAPES = [
    ("gather_qmm", *s)
    for s in ((1, 7, 16), (3, 33, 48), (33, 100, 64), (300, 7, 48), (40, 1, 4096))
] + [
    ("gather_qmm_w4a8", *s)
    for s in ((1, 7, 32), (3, 33, 64), (40, 100, 96), (300, 7, 64), (17, 1, 4096))
]


@pytest.mark.parametrize(("verb", "m", "n", "k"), _GATHER_SHAPES)
def test_gather_unsorted_sorted_and_out_of_range(
    isa: str, verb: str, m: int, n: int, k: int
) -> None:
    """W4A16 and W4A8 gathers: ids outside [0, E) give exactly zero rows and their x is never
    read (NaN and Inf there must not show); sorting the rows permutes the result."""
    e = 4
    p = expert_stack(e, n, k, seed=m + n)
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ids = rng.integers(-2, e + 2, size=m)  # includes -2, -1, E, E+1: zero rows
    ids[0] = e - 1  # at least one row in range
    x[ids >= e] = np.nan  # rows never read: their NaN must not show
    x[ids < 0] = np.inf
    y = check_gather(verb, isa, p, x, ids, sort=False)
    order = np.argsort(ids, kind="stable")
    ys = check_gather(verb, isa, p, x[order], ids[order], sort=True)
    # sorting the rows permutes the result and nothing else
    np.testing.assert_array_equal(ys, y[order])


def test_gather_many_rows_per_expert_and_idle_experts(isa: str) -> None:
    """More rows per expert than one chunk holds, and experts with no rows at all."""
    p = expert_stack(6, 33, 64, seed=3)
    ids = np.array([4] * 70 + [1] * 3 + [4] * 5, dtype=np.int64)
    x = np.random.default_rng(4).standard_normal((ids.size, 64)).astype(np.float32)
    check_gather("gather_qmm", isa, p, x, ids, sort=False)


def test_gather_per_expert_and_partition_globals(isa: str) -> None:
    p = expert_stack(3, 20, 32, seed=5, partitions=(0, 8, 20))
    assert p.global_scale.shape == (3, 2)
    ids = np.array([2, 0, 1, 1, 2, 0, 5], dtype=np.int32)
    x = np.random.default_rng(6).standard_normal((7, 32)).astype(np.float32)
    y = check_gather("gather_qmm", isa, p, x, ids, sort=False)
    ref = reference.gather_qmm(x, p, ids, out_dtype=None)
    for a, c in ((0, 8), (8, 20)):  # each partition on its own scale
        for e in range(3):
            rows = ids == e
            check_close(
                "gather_qmm", "float32", y[rows, a:c], ref[rows, a:c], f"{isa} e{e} {a}:{c}"
            )


def test_gather_scalar_global_and_id_dtypes(isa: str) -> None:
    rng = np.random.default_rng(8)
    p = nvfp4.quantize(
        rng.standard_normal((2, 9, 48)).astype(np.float32), global_scale=np.float32(0.01)
    )
    x = rng.standard_normal((5, 48)).astype(np.float32)
    for dtype in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64):
        ids = np.array([0, 1, 1, 0, 1], dtype=dtype)
        check_gather("gather_qmm", isa, p, x, ids, sort=False)
    huge = np.array([0, 2**64 - 1, 2**63, 1, 7], dtype=np.uint64)  # beyond int64: out of range
    b = CPUBackend(isa=isa)
    y = b.gather_qmm(x, b.prepare(p), huge)
    assert (y[[1, 2, 4]] == 0).all()
    assert (y[[0, 3]] != 0).any()


def test_gather_dtypes_and_empty(isa: str) -> None:
    p = expert_stack(2, 7, 32, seed=9)
    b = CPUBackend(isa=isa)
    pw = b.prepare(p)
    x = np.random.default_rng(10).standard_normal((4, 32)).astype(np.float16)
    ids = np.array([1, 0, 1, 3])
    y = b.gather_qmm(x, pw, ids)
    assert y.dtype == np.float16
    check_close("gather_qmm", "float16", y, reference.gather_qmm(x, p, ids, out_dtype=np.float16))
    assert b.gather_qmm(np.zeros((0, 32), np.float32), pw, np.zeros(0, np.int64)).shape == (0, 7)


def test_gather_thread_counts_give_identical_bits(isa: str) -> None:
    p = expert_stack(5, 100, 256, seed=11)
    rng = np.random.default_rng(12)
    ids = rng.integers(-1, 6, size=90)
    x = rng.standard_normal((90, 256)).astype(np.float32)
    ys = [CPUBackend(isa=isa, threads=t).gather_qmm(x, p, ids) for t in (1, 2, 3)]
    for y in ys[1:]:
        np.testing.assert_array_equal(y.view(np.uint32), ys[0].view(np.uint32))


def test_gather_refusals() -> None:
    b = CPUBackend()
    p = expert_stack(2, 7, 32, seed=13)
    pw = b.prepare(p)
    x = np.ones((3, 32), np.float32)
    with pytest.raises(ValueError, match="sorted_indices=True but expert_ids are not sorted"):
        b.gather_qmm(x, pw, np.array([1, 0, 1]), sorted_indices=True)
    with pytest.raises(ValueError, match=r"expert_ids must be integer \[M\] with M = 3"):
        b.gather_qmm(x, pw, np.array([0, 1]))
    with pytest.raises(ValueError, match="expert_ids must be integer"):
        b.gather_qmm(x, pw, np.array([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match=r"x must be \[M, K\]"):
        b.gather_qmm(np.ones((1, 3, 32), np.float32), pw, np.array([0]))
    flat = b.prepare(nvfp4.quantize(np.ones((7, 32), np.float32)))
    with pytest.raises(ValueError, match=r"weights must be \[E, N, K\]"):
        b.gather_qmm(x, flat, np.array([0, 0, 0]))
