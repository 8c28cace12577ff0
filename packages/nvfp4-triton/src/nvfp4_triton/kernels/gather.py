"""MoE ``gather_qmm``: row ``m`` of x times expert ``ids[m]`` of an ``[E, N, K]`` weight.

An expert id outside ``[0, E)`` gives an exactly zero output row, and nothing is read for it:
every weight address is formed from a *safe* expert index (the id when it is valid, 0
otherwise) and every load is masked by the validity predicate, so an id of ``-1`` or
``2^20`` can neither read out of bounds nor pull a NaN from x into the output.

Two kernels:

* :func:`gather_rows_kernel` (unsorted ids, few rows - decode): one program per row of x and
  ``BLOCK_N`` output columns streams that row's expert like the GEMV does. Rows that share an
  expert read its tile again; with a handful of rows that costs less than sorting them.
* :func:`gather_grouped_kernel` (sorted, or many rows): the launch wrapper groups the rows by
  expert (a stable argsort on the device, or nothing when the caller passes sorted ids) and
  cuts each expert's rows into tiles of ``BLOCK_M``. One program per (tile, ``BLOCK_N``
  columns) reads its expert's weight tile once for all the tile's rows and accumulates with
  ``tl.dot``, like the prefill GEMM. The tile table has a fixed upper bound of
  ``cdiv(M, BLOCK_M) + min(E, M)`` entries, computed without a device-to-host copy; the
  unused entries name expert ``E`` and do nothing.

Both apply the row's expert (and partition) global after accumulation: ``row_g`` is
``[E * N]``, expert ``e``'s rows at ``e * N``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import round_out
from .common import dot_words_rows, grouped_tile, store_rows, stream_rows

__all__ = ["gather_grouped_kernel", "gather_rows_kernel"]


@triton.jit
def gather_rows_kernel(
    x_ptr,  # [M, K], row stride stride_xm
    ids_ptr,  # int32 | int64 [M]
    codes_ptr,  # uint8 [E * N, K/2]
    scales_ptr,  # uint8 [E * N, K/16]
    row_g_ptr,  # float32 [E * N]
    out_ptr,  # [M, N], row stride stride_om
    N,
    K,
    E,
    stride_xm,
    stride_om,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid: ``(M, cdiv(N, BLOCK_N))``. The loop is the GEMV's with one row of x
    (:func:`~nvfp4_triton.kernels.common.stream_chunk`): int32 words decoded 8 codes at a
    time, products summed per 16-element block inside one thread, each block's scale
    applied once, the block accumulators reduced across threads after the loop."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N

    expert = tl.load(ids_ptr + row).to(tl.int64)
    valid = (expert >= 0) & (expert < E)
    safe = tl.where(valid, expert, 0)  # no address is ever formed from an invalid id
    w_row = safe * N + n  # this expert's weight rows
    # The validity predicate enters every mask as a bound: an invalid row has K and N
    # bounds of 0, so it runs no iteration and loads nothing. (Bounds rather than
    # `tensor & scalar`, which the interpreter mistypes.)
    k_end = tl.where(valid, K, 0)
    n_end = tl.where(valid, N, 0)
    n_valid = n < n_end

    one_row = tl.arange(0, 1)  # [1]: this program's one row of x, as a row tile of size 1

    # The GEMV's loop (stream_rows) over [0, k_end), whole chunks unmasked, with the
    # expert's rows past N clamped to its row N - 1 (their sums are never stored; an
    # invalid id has no chunk at all).
    w_row_ld = safe * N + tl.minimum(n, N - 1)
    acc = stream_rows(
        codes_ptr,
        scales_ptr,
        w_row_ld,
        x_ptr + row * stride_xm + one_row,
        0,
        k_end,
        K,
        n_valid,
        one_row < 1,
        1,
        BLOCK_N,
        BLOCK_K,
    )
    acc1 = tl.sum(acc, axis=0)  # [BLOCK_N]

    g = tl.load(row_g_ptr + w_row, mask=n_valid, other=0.0)
    y = tl.where(valid, acc1 * g, 0.0)  # exactly zero for an out-of-range id
    tl.store(out_ptr + row * stride_om + n, round_out(y, out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def gather_grouped_kernel(
    x_ptr,  # [M, K], row stride stride_xm
    ids_ptr,  # int32 | int64 [M]
    perm_ptr,  # int64 [M]: row of x at each sorted position (unused when not HAS_PERM)
    tiles_ptr,  # int64 [T, 3]: tile t's expert (E: unused), first sorted position, segment end
    codes_ptr,  # uint8 [E * N, K/2]
    scales_ptr,  # uint8 [E * N, K/16]
    row_g_ptr,  # float32 [E * N]
    out_ptr,  # [M, N], zero-filled by the wrapper (rows of invalid ids stay zero)
    N,
    K,
    E,
    stride_xm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP32_PRECISION: tl.constexpr,
    HAS_PERM: tl.constexpr,
):
    """Grid: ``(T, cdiv(N, BLOCK_N))``."""
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    # the tile's rows of x (routed to its expert), the expert's weight rows, the bounds
    row, row_ok, w_row, n_valid, k_end = grouped_tile(
        tiles_ptr, perm_ptr, ids_ptr, n, N, K, E, BLOCK_M, HAS_PERM
    )
    # The chunk loop is the GEMM's (dot_words_rows): code words, eight dots per chunk.
    acc = dot_words_rows(
        x_ptr + row * stride_xm,
        row_ok,
        codes_ptr,
        scales_ptr,
        w_row,
        n_valid,
        K,
        k_end,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        DOT_DTYPE,
        FP32_PRECISION,
    )
    store_rows(acc, row_g_ptr, w_row, n_valid, out_ptr, row, row_ok, n, n_mask, stride_om)
