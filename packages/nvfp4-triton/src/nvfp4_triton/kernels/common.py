"""Helpers shared by the kernels: a K chunk of the streaming kernels (GEMV, MoE per-row
gather), ``tl.dot`` in float32, and a K chunk given as code words multiplied into a
tensor-core accumulator."""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import E2M1_UNSCALE, e2m1_code_scaled, e4m3_valid_to_f32

__all__ = ["dot_acc", "dot_words", "stream_chunk"]


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
