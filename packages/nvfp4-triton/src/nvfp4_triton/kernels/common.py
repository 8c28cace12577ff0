"""Helpers shared by the kernels: decoding a tile of packed bytes, and ``tl.dot``."""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import e2m1_to_f32, e4m3_valid_to_f32

__all__ = ["decode_pair", "dot_acc"]


@triton.jit
def decode_pair(byte, scale_byte):
    """Packed code bytes and the scale byte of each (same shape, int32) -> the values of the
    even (low nibble) and odd (high nibble) elements, ``e2m1 * e4m3`` in float32. The
    product is exact: at most 2 x 4 significant bits, so it is also exact in bfloat16 and
    float16 (the smallest, 0.5 * 2^-9, and the largest, 6 * 448, are in range)."""
    scale = e4m3_valid_to_f32(scale_byte)  # validated planes: bytes 0x00..0x7E
    return e2m1_to_f32(byte & 15) * scale, e2m1_to_f32(byte >> 4) * scale


@triton.jit
def dot_acc(a, b, acc, FP32_PRECISION: tl.constexpr):
    """``acc + a @ b`` in float32. float32 operands use ``FP32_PRECISION`` (``"ieee"`` or
    ``"tf32x3"``, from the backend's config); bfloat16 / float16 operands multiply exactly
    into the float32 accumulator."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision=FP32_PRECISION)
    else:
        return tl.dot(a, b, acc)
