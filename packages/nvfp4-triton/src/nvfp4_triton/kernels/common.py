"""Helpers shared by the kernels (``@triton.jit`` functions: Triton inlines them, so a
kernel compiles as if they were written in place):

* the K loop of the streaming kernels (GEMV, MoE per-row gather): :func:`stream_rows` over
  :func:`stream_chunk`;
* the K loop of the tensor-core kernels (prefill GEMM, MoE grouped gather):
  :func:`dot_words_rows` over :func:`dot_words` and :func:`dot_acc`;
* a tile of the grouped MoE tile table (W4A16 grouped gather, W4A8 MoE):
  :func:`grouped_tile`;
* the common epilogue, the global after accumulation and the masked store:
  :func:`store_rows`."""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import E2M1_UNSCALE, e2m1_code_scaled, e4m3_valid_to_f32, round_out

__all__ = [
    "dot_acc",
    "dot_words",
    "dot_words_rows",
    "grouped_tile",
    "store_rows",
    "stream_chunk",
    "stream_rows",
]


@triton.jit
def dot_acc(a, b, acc, FP32_PRECISION: tl.constexpr):
    """``acc + a @ b`` in float32. float32 operands use ``FP32_PRECISION`` (``"ieee"`` or
    ``"tf32x3"``, from the backend's config); bfloat16 / float16 operands multiply exactly
    into the float32 accumulator."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision=FP32_PRECISION)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def dot_words(
    x_ptrs, x_mask, word, scale_byte, acc, DOT_DTYPE: tl.constexpr, FP32_PRECISION: tl.constexpr
):
    """``acc + x_chunk @ w_chunk`` for one K chunk given as code words, in float32.

    ``word`` is ``[WORDS, BLOCK_N]`` int32 (word ``w`` of column ``n`` holds the codes of
    elements ``8w .. 8w + 7`` of the chunk) and ``scale_byte`` the ``[WORDS, BLOCK_N]`` scale
    byte of each word's block; ``x_ptrs`` / ``x_mask`` address element ``8w`` of the chunk
    in every row of x (``[BLOCK_M, WORDS]``). The chunk's product is the sum over ``r`` of
    ``x[:, 8w + r] @ value_r[w, n]``: eight dots of inner size ``WORDS`` (at least 16 for
    a 16-bit ``tl.dot``, so a chunk is at least 128 elements). Each word is decoded once
    (:func:`~nvfp4_triton.codec.e2m1_code_scaled`) and its values multiplied by the
    block's scale times 2^14: the exact ``e2m1 * e4m3``, exact in every ``DOT_DTYPE``."""
    scale = e4m3_valid_to_f32(scale_byte) * E2M1_UNSCALE
    for r in tl.static_range(8):
        x_r = tl.load(x_ptrs + r, mask=x_mask, other=0.0).to(DOT_DTYPE)  # [BLOCK_M, WORDS]
        w_r = (e2m1_code_scaled(word, r) * scale).to(DOT_DTYPE)  # [WORDS, BLOCK_N]
        acc = dot_acc(x_r, w_r, acc, FP32_PRECISION)
    return acc


@triton.jit
def dot_words_rows(
    x_row,
    x_ok,
    codes_ptr,
    scales_ptr,
    w_row,
    w_ok,
    K,
    k_end,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP32_PRECISION: tl.constexpr,
):
    """``x_tile @ w_tile.T`` in float32 ``[BLOCK_M, BLOCK_N]`` over elements ``[0, k_end)``
    of K, in chunks of ``BLOCK_K`` (:func:`dot_words`), the global not applied.

    ``x_row`` ``[BLOCK_M]`` addresses element 0 of each row of x, read where ``x_ok``;
    ``w_row`` ``[BLOCK_N]`` (int64) are weight rows (``K / 2`` code bytes = ``K / 8`` int32
    words and ``K / 16`` scale bytes each), read where ``w_ok``. ``k_end`` is K, or 0 for
    a tile that reads nothing."""
    WORDS: tl.constexpr = BLOCK_K // 8  # int32 code words per weight row of a chunk
    w = tl.arange(0, WORDS)  # word w of a chunk: elements 8w .. 8w + 7
    # Loop-invariant addresses: the chunk at k0 (a multiple of BLOCK_K) starts at word k0 // 8
    # of a weight row, and its word w uses scale (k0 + 8w) // 16.
    words = codes_ptr.to(tl.pointer_type(tl.int32))
    word_cols = words + w_row[None, :] * (K // 8) + w[:, None]  # [WORDS, BLOCK_N], transposed
    scale_cols = scales_ptr + w_row[None, :] * (K // 16) + (w // 2)[:, None]
    x_rows = x_row[:, None] + (8 * w)[None, :]  # [BLOCK_M, WORDS]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        w_in = (k0 + 8 * w) < k_end  # [WORDS]: K is a multiple of 16, so a word is in or out
        w_mask = w_in[:, None] & w_ok[None, :]
        word = tl.load(word_cols + k0 // 8, mask=w_mask, other=0)
        sbyte = tl.load(scale_cols + k0 // 16, mask=w_mask, other=0)
        x_mask = x_ok[:, None] & w_in[None, :]
        acc = dot_words(
            x_rows + k0, x_mask, word, sbyte.to(tl.int32), acc, DOT_DTYPE, FP32_PRECISION
        )
    return acc


@triton.jit
def grouped_tile(
    tiles_ptr, perm_ptr, ids_ptr, n, N, K, E, BLOCK_M: tl.constexpr, HAS_PERM: tl.constexpr
):
    """This program's tile ``t`` (grid axis 0) of the grouped MoE tile table
    (:func:`nvfp4_triton.ops._grouped_tiles`: int64 ``[T, 3]``, row ``t`` = ``(expert,
    start, end)``) at output columns ``n``: ``(row, row_ok, w_row, n_ok, k_end)``.

    The tile holds up to ``BLOCK_M`` sorted positions ``start ..`` (before ``end``) of its
    expert's segment, mapped to rows of x (``row``, through ``perm`` when ``HAS_PERM``). Each row's own id is read back and must name the tile's expert
    (``row_ok``), so only rows routed here are read or written whatever the table says.
    ``w_row`` are the expert's weight rows for the columns ``n`` (read where ``n_ok``),
    formed from a *safe* expert index (an invalid one never forms an address); an unused
    tile (expert ``E``) gets bounds of 0 for rows, columns and K (``k_end``): it loads and
    stores nothing. (Bounds rather than ``tensor & scalar``, which the interpreter
    mistypes.)"""
    # row t of the table: t < T by the grid, so these three loads are in range
    tile = tiles_ptr + 3 * tl.program_id(0).to(tl.int64)
    expert = tl.load(tile)
    start = tl.load(tile + 1)
    end = tl.load(tile + 2)
    active = (expert >= 0) & (expert < E)
    safe = tl.where(active, expert, 0)
    end = tl.where(active, end, 0)
    n_ok = n < tl.where(active, N, 0)
    k_end = tl.where(active, K, 0)
    pos = start + tl.arange(0, BLOCK_M)  # sorted positions of the tile
    pos_ok = pos < end
    if HAS_PERM:
        row = tl.load(perm_ptr + pos, mask=pos_ok, other=0).to(tl.int64)
    else:
        row = pos.to(tl.int64)
    row_id = tl.load(ids_ptr + row, mask=pos_ok, other=-1).to(tl.int64)
    row_ok = pos_ok & (row_id == expert)
    w_row = safe * N + n  # expert `safe`'s weight rows
    return row, row_ok, w_row, n_ok, k_end


@triton.jit
def store_rows(acc, row_g_ptr, w_row, w_ok, out_ptr, row, row_ok, n, n_mask, stride_om):
    """The epilogue: ``round_out(acc * row_g[w_row])`` (the global after accumulation, read
    where ``w_ok``) stored at rows ``row`` and columns ``n`` of the output (row stride
    ``stride_om``) where ``row_ok`` and ``n_mask``."""
    g = tl.load(row_g_ptr + w_row, mask=w_ok, other=0.0)
    y = round_out(acc * g[None, :], out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + row[:, None] * stride_om + n[None, :],
        y,
        mask=row_ok[:, None] & n_mask[None, :],
    )


@triton.jit
def _load_x(ptrs, mask, MASKED: tl.constexpr):
    """x at ``ptrs`` as float32: masked (0 outside) or, for a whole chunk, not at all."""
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    else:
        return tl.load(ptrs).to(tl.float32)


@triton.jit
def stream_chunk(
    word_rows,
    s_rows,
    x_rows,
    k0,
    k_hi,
    b,
    n_mask,
    m_mask,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCKS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One K chunk of the streaming kernels (the GEMV and the MoE per-row gather): the
    per-block sums of ``x @ w``, scaled, ``[BLOCK_M, BLOCK_N, BLOCKS]``.

    ``word_rows`` ``[BLOCK_N, BLOCKS, 2]`` addresses the int32 code words of the chunk at 0
    (word ``wi`` of block ``b`` holds elements ``16 b + 8 wi + r``, ``r = 0..7``),
    ``s_rows`` ``[BLOCK_N, BLOCKS]`` its scale bytes, ``x_rows`` ``[BLOCK_M, BLOCKS, 2]``
    element ``16 b + 8 wi`` of each row of x; the chunk at ``k0`` is at word offset
    ``k0 // 8``, scale offset ``k0 // 16`` and element offset ``k0``. The codes are decoded
    8 per word (:func:`~nvfp4_triton.codec.e2m1_code_scaled`), a block's two words are one
    thread's, so its products are summed inside the thread and its scale (times 2^14)
    applied once. ``MASKED``: the chunk may run past ``k_hi`` and the rows past N / M;
    otherwise every load is in range and none is masked (a masked load also clears its
    register first)."""
    if MASKED:
        b_in = (k0 + 16 * b) < k_hi  # [BLOCKS]: block b of the chunk in range
        word = tl.load(
            word_rows + k0 // 8, mask=n_mask[:, None, None] & b_in[None, :, None], other=0
        )
        sbyte = tl.load(s_rows + k0 // 16, mask=n_mask[:, None] & b_in[None, :], other=0)
        xm = m_mask[:, None, None] & b_in[None, :, None]
    else:
        word = tl.load(word_rows + k0 // 8)  # [BLOCK_N, BLOCKS, 2]
        sbyte = tl.load(s_rows + k0 // 16)  # [BLOCK_N, BLOCKS]
        xm = None
    scale = e4m3_valid_to_f32(sbyte.to(tl.int32)) * E2M1_UNSCALE  # [BLOCK_N, BLOCKS]
    xw = x_rows + k0
    if BLOCK_M == 1:
        # decode proper: [1, BLOCKS, 2] elements of x against [BLOCK_N, BLOCKS, 2] words;
        # code r of each word is element 8 wi + r of block b; values * 2^-14
        part = _load_x(xw, xm, MASKED) * e2m1_code_scaled(word, 0)
        for r in tl.static_range(1, 8):
            part += _load_x(xw + r, xm, MASKED) * e2m1_code_scaled(word, r)
        return (tl.sum(part, axis=2) * scale)[None, :, :]
    else:
        # [BLOCK_M, 1, BLOCKS, 2] x [1, BLOCK_N, BLOCKS, 2]
        part = _load_x(xw, xm, MASKED)[:, None] * e2m1_code_scaled(word, 0)[None]
        for r in tl.static_range(1, 8):
            part += _load_x(xw + r, xm, MASKED)[:, None] * e2m1_code_scaled(word, r)[None]
        return tl.sum(part, axis=3) * scale[None, :, :]


@triton.jit
def stream_rows(
    codes_ptr,
    scales_ptr,
    w_row,
    x_row,
    k_lo,
    k_hi,
    K,
    n_mask,
    m_mask,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The K loop of the streaming kernels over elements ``[k_lo, k_hi)`` (``k_lo`` a
    multiple of ``BLOCK_K``): ``x @ w.T`` in float32 ``[BLOCK_M, BLOCK_N]``, the global not
    applied.

    ``w_row`` ``[BLOCK_N]`` (int64) are weight rows and ``x_row`` ``[BLOCK_M]`` the addresses
    of element 0 of rows of x, both clamped into range by the caller, so every address is
    valid whether a load is masked or not; ``n_mask`` / ``m_mask`` say which rows are real.
    Whole chunks run first, with no masks at all (a clamped row's sums are never stored),
    then the one partial chunk at the end, if any, with masks: a masked load costs a
    register clear per element on top of the load, which the steady state does not pay."""
    BLOCKS: tl.constexpr = BLOCK_K // 16  # 16-element scale blocks per chunk
    b = tl.arange(0, BLOCKS)  # scale block b of a chunk: words 2b, 2b + 1, scale b
    wi = tl.arange(0, 2)  # word wi of a block: elements 8 wi .. 8 wi + 7 of the block
    # Row n of the codes is K / 8 words (K / 2 bytes); the chunk at k0 (a multiple of 16)
    # starts at word k0 // 8 and scale k0 // 16 (stream_chunk adds them). x's word-aligned
    # elements: element 0 of word wi of block b is 16 b + 8 wi.
    words = codes_ptr.to(tl.pointer_type(tl.int32))
    word_rows = words + w_row[:, None, None] * (K // 8) + (2 * b)[None, :, None]
    word_rows += wi[None, None, :]  # [BLOCK_N, BLOCKS, 2]
    s_rows = scales_ptr + w_row[:, None] * (K // 16) + b[None, :]  # [BLOCK_N, BLOCKS]
    x_rows = x_row[:, None, None] + (16 * b)[None, :, None]
    x_rows += (8 * wi)[None, None, :]  # [BLOCK_M, BLOCKS, 2]
    k_full = k_lo + (k_hi - k_lo) // BLOCK_K * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS), dtype=tl.float32)
    for k0 in range(k_lo, k_full, BLOCK_K):
        acc += stream_chunk(
            word_rows, s_rows, x_rows, k0, k_hi, b, n_mask, m_mask, BLOCK_M, BLOCK_N, BLOCKS, False
        )
    for k0 in range(k_full, k_hi, BLOCK_K):
        acc += stream_chunk(
            word_rows, s_rows, x_rows, k0, k_hi, b, n_mask, m_mask, BLOCK_M, BLOCK_N, BLOCKS, True
        )
    return tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]: across the block positions, once
