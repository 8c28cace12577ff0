"""Helpers shared by the tensor-core kernels: ``tl.dot`` in float32, and a K chunk given as
code words multiplied into an accumulator."""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import E2M1_UNSCALE, e2m1_code_scaled, e4m3_valid_to_f32

__all__ = ["dot_acc", "dot_words"]


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
