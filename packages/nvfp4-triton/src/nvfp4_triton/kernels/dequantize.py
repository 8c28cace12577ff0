"""Dequantize: canonical planes -> a dense float32 / float16 / bfloat16 matrix, exactly.

``out[r, k] = round_out((e2m1(code[r, k]) * e4m3(scale[r, k // 16])) * row_g[r])``: the
first product is exact, the multiply by the row's global rounds once in float32, and a
float16 / bfloat16 output is that float32 value rounded to nearest even - spec 1.0
"Decoding", bit-identical to :func:`nvfp4.reference.dequantize`.

Grid: ``(cdiv(rows, BLOCK_N), cdiv(K, BLOCK_K))``; ``rows`` counts every expert's rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import e2m1_to_f32, e4m3_valid_to_f32, round_out

__all__ = ["dequantize_kernel"]


@triton.jit
def dequantize_kernel(
    codes_ptr,  # uint8 [rows, K/2]
    scales_ptr,  # uint8 [rows, K/16]
    row_g_ptr,  # float32 [rows]
    out_ptr,  # float32 | float16 | bfloat16 [rows, K]
    rows,
    K,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # This program's tile: rows r (int64: rows * K can pass 2^31) x element columns k.
    r = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    r_mask = r < rows
    mask = r_mask[:, None] & (k < K)[None, :]

    # Element k lives in byte k // 2 of its row, low nibble when k is even, high when odd
    # (adjacent lanes read the same byte: one coalesced access). Its scale is byte k // 16.
    byte = tl.load(codes_ptr + r[:, None] * (K // 2) + (k // 2)[None, :], mask=mask, other=0)
    code = (byte.to(tl.int32) >> ((k & 1) * 4).to(tl.int32)[None, :]) & 15
    sbyte = tl.load(scales_ptr + r[:, None] * (K // 16) + (k // 16)[None, :], mask=mask, other=0)
    g = tl.load(row_g_ptr + r, mask=r_mask, other=0.0)

    value = e2m1_to_f32(code) * e4m3_valid_to_f32(sbyte.to(tl.int32))  # exact
    value = value * g[:, None]  # the one float32 rounding
    out = round_out(value, out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None] * K + k[None, :], out, mask=mask)
