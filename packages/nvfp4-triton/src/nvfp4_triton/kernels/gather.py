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
from .common import dot_words, stream_chunk

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
    BLOCKS: tl.constexpr = BLOCK_K // 16  # 16-element blocks per chunk
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

    b = tl.arange(0, BLOCKS)  # block b of a chunk: words 2b, 2b + 1, scale b
    wi = tl.arange(0, 2)  # word wi of a block: its elements 8 wi .. 8 wi + 7
    words = codes_ptr.to(tl.pointer_type(tl.int32))
    x_rows = x_ptr + row * stride_xm + (16 * b)[None, :, None] + (8 * wi)[None, None, :]
    one_row = tl.arange(0, 1) < 1  # the m mask of a single row of x

    # Whole chunks unmasked, with the expert's rows past N clamped to its row N - 1 (their
    # sums are never stored; an invalid id has no chunk at all), then the partial chunk.
    w_row_ld = safe * N + tl.minimum(n, N - 1)
    word_rows = words + w_row_ld[:, None, None] * (K // 8) + (2 * b)[None, :, None]
    word_rows += wi[None, None, :]  # [BLOCK_N, BLOCKS, 2]
    s_rows = scales_ptr + w_row_ld[:, None] * (K // 16) + b[None, :]  # [BLOCK_N, BLOCKS]
    k_full = k_end // BLOCK_K * BLOCK_K
    acc = tl.zeros((1, BLOCK_N, BLOCKS), dtype=tl.float32)
    for k0 in range(0, k_full, BLOCK_K):
        acc += stream_chunk(
            word_rows, s_rows, x_rows, k0, k_end, b, n_valid, one_row, 1, BLOCK_N, BLOCKS, False
        )
    for k0 in range(k_full, k_end, BLOCK_K):
        acc += stream_chunk(
            word_rows, s_rows, x_rows, k0, k_end, b, n_valid, one_row, 1, BLOCK_N, BLOCKS, True
        )
    acc1 = tl.sum(tl.sum(acc, axis=2), axis=0)  # [BLOCK_N]

    g = tl.load(row_g_ptr + w_row, mask=n_valid, other=0.0)
    y = tl.where(valid, acc1 * g, 0.0)  # exactly zero for an out-of-range id
    tl.store(out_ptr + row * stride_om + n, round_out(y, out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def gather_grouped_kernel(
    x_ptr,  # [M, K], row stride stride_xm
    ids_ptr,  # int32 | int64 [M]
    perm_ptr,  # int64 [M]: row of x at each sorted position (unused when not HAS_PERM)
    tile_expert_ptr,  # int64 [T]: expert of tile t (E for an unused tile)
    tile_start_ptr,  # int64 [T]: first sorted position of tile t
    tile_end_ptr,  # int64 [T]: end of the expert's segment (tile t covers < BLOCK_M of it)
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
    WORDS: tl.constexpr = BLOCK_K // 8  # int32 code words per weight row of a chunk
    t = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N

    expert = tl.load(tile_expert_ptr + t)
    start = tl.load(tile_start_ptr + t)
    end = tl.load(tile_end_ptr + t)
    active = (expert >= 0) & (expert < E)
    safe = tl.where(active, expert, 0)
    # An unused tile gets bounds of 0 (row, column and K), so it loads and stores nothing.
    end = tl.where(active, end, 0)
    n_end = tl.where(active, N, 0)
    k_end = tl.where(active, K, 0)
    n_valid = n < n_end

    # The tile's rows: sorted positions start .. start + BLOCK_M - 1 (within the segment),
    # mapped to rows of x; each row's own id is read back and must name this expert, so
    # only rows routed here are read or written whatever the tile table says.
    pos = start + tl.arange(0, BLOCK_M)
    pos_mask = pos < end
    if HAS_PERM:
        row = tl.load(perm_ptr + pos, mask=pos_mask, other=0).to(tl.int64)
    else:
        row = pos.to(tl.int64)
    row_id = tl.load(ids_ptr + row, mask=pos_mask, other=-1).to(tl.int64)
    row_ok = pos_mask & (row_id == expert)

    # The chunk loop is the GEMM's (see nvfp4_triton.kernels.gemm): code words, eight dots.
    w_row = safe * N + n
    w = tl.arange(0, WORDS)
    words = codes_ptr.to(tl.pointer_type(tl.int32))
    word_cols = words + w_row[None, :] * (K // 8) + w[:, None]  # [WORDS, BLOCK_N]
    scale_cols = scales_ptr + w_row[None, :] * (K // 16) + (w // 2)[:, None]
    x_rows = x_ptr + row[:, None] * stride_xm + (8 * w)[None, :]  # [BLOCK_M, WORDS]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        w_in = (k0 + 8 * w) < k_end
        w_mask = w_in[:, None] & n_valid[None, :]
        word = tl.load(word_cols + k0 // 8, mask=w_mask, other=0)
        sbyte = tl.load(scale_cols + k0 // 16, mask=w_mask, other=0)
        x_mask = row_ok[:, None] & w_in[None, :]
        acc = dot_words(
            x_rows + k0, x_mask, word, sbyte.to(tl.int32), acc, DOT_DTYPE, FP32_PRECISION
        )

    g = tl.load(row_g_ptr + w_row, mask=n_valid, other=0.0)
    y = round_out(acc * g[None, :], out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + row[:, None] * stride_om + n[None, :],
        y,
        mask=row_ok[:, None] & n_mask[None, :],
    )
