"""Activation quantization to NVFP4, bit-exact to :func:`nvfp4.reference.quantize_activations`.

For each block of 16 elements of a row of x (the global ``g`` given, float32 > 0), in
float32 and in this order (spec 1.0, "The reference encoder"):

1. ``amax`` = the largest ``|x|`` of the block's finite elements;
2. ``s = amax / (6 * g)`` - the product first, then one correctly rounded division
   (``tl.math.div_rn``: a plain ``/`` may compile to an approximate division);
3. ``s == 0 -> 1``; clamp to ``[2^-9, 448]``; round to E4M3, nearest even (the byte);
4. ``q = x / (e4m3(s) * g)`` - the product first, one correctly rounded division;
5. the E2M1 code: ``|q|`` nearest-even saturating at 6, sign bit ``x < 0``;
6. a block holding NaN or Inf gets scale byte :data:`nvfp4.spec.E4M3_NAN_BYTE` (``0x7F``,
   NaN) and all-zero codes.

Codes are written ``[M, K/2]`` (element ``2j`` in the low nibble). Scales are written
either linear ``[M, K/16]`` or into the 128x4-swizzled buffer (cuBLASLt / CUTLASS / torch
``SWIZZLE_32_4_4``). The swizzle formula is not restated here: the wrapper passes the byte
offsets of one 128-row band, computed by :func:`nvfp4.spec.swizzle_128x4_offset`, and the
band stride; row ``r`` of block ``b`` goes to ``band[(r % 128) * KB + b] + (r // 128) *
BAND_STRIDE``. The wrapper zero-fills the buffer, so the padding bytes are zero.

Each program loads a ``[BLOCK_M, BLOCK_KB, 8]`` tile of even elements and one of odd
elements (a byte's two nibbles), so packing needs no shuffle.

Grid: ``(cdiv(M, BLOCK_M), cdiv(K/16, BLOCK_KB))``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from nvfp4.spec import E4M3_NAN_BYTE

from ..codec import clamp_scale, e2m1_rne_index, e4m3_rne

__all__ = ["quantize_kernel"]

_NAN_BYTE = tl.constexpr(E4M3_NAN_BYTE)  # the scale byte of a block holding NaN or Inf


@triton.jit
def _encode(x, denom):
    """Finite x (float32) and the block's ``e4m3(s) * g`` -> 4-bit codes (int32)."""
    q = tl.math.div_rn(x, denom)
    return e2m1_rne_index(tl.abs(q)) | ((x < 0).to(tl.int32) << 3)


@triton.jit
def quantize_kernel(
    x_ptr,  # [M, K] float32 | float16 | bfloat16, row stride stride_xm
    g_ptr,  # float32 [1]: the activation global (static input_scale or amax / 2688)
    codes_ptr,  # uint8 [M, K/2]
    scales_ptr,  # uint8 [M, K/16] (linear) or the zero-filled swizzled buffer
    band_ptr,  # int64 [128 * K/16]: swizzled offsets of one 128-row band (SWIZZLED only)
    M,
    K,
    stride_xm,
    BAND_STRIDE,  # bytes between consecutive 128-row bands of the swizzled buffer
    BLOCK_M: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    SWIZZLED: tl.constexpr,
):
    KB = K // 16
    r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x
    b = tl.program_id(1).to(tl.int64) * BLOCK_KB + tl.arange(0, BLOCK_KB)  # blocks of 16
    e = tl.arange(0, 8)  # byte e of a block: elements 2e (even) and 2e + 1 (odd)
    block_mask = (r < M)[:, None] & (b < KB)[None, :]  # [BLOCK_M, BLOCK_KB]
    mask = block_mask[:, :, None]

    col = b[None, :, None] * 16 + 2 * e[None, None, :]  # [1, BLOCK_KB, 8]: even elements
    x_ptrs = x_ptr + r[:, None, None] * stride_xm + col
    x_even = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    x_odd = tl.load(x_ptrs + 1, mask=mask, other=0.0).to(tl.float32)

    # Non-finite elements are left out of the block amax; their block is flagged.
    fin_even = (x_even == x_even) & (tl.abs(x_even) != float("inf"))
    fin_odd = (x_odd == x_odd) & (tl.abs(x_odd) != float("inf"))
    x_even = tl.where(fin_even, x_even, 0.0)
    x_odd = tl.where(fin_odd, x_odd, 0.0)
    bad = tl.max((~fin_even | ~fin_odd).to(tl.int32), axis=2) > 0  # [BLOCK_M, BLOCK_KB]
    amax = tl.maximum(tl.max(tl.abs(x_even), axis=2), tl.max(tl.abs(x_odd), axis=2))

    g = tl.load(g_ptr)
    s = tl.math.div_rn(amax, 6.0 * g)  # block_amax / (6 * g), product first
    s = clamp_scale(tl.where(s == 0.0, 1.0, s))
    sbyte, svalue = e4m3_rne(s)
    denom = (svalue * g)[:, :, None]  # e4m3(s) * g, product first

    codes = _encode(x_even, denom) | (_encode(x_odd, denom) << 4)
    codes = tl.where(bad[:, :, None], 0, codes)
    sbyte = tl.where(bad, _NAN_BYTE, sbyte)

    tl.store(
        codes_ptr + r[:, None, None] * (K // 2) + b[None, :, None] * 8 + e[None, None, :],
        codes.to(tl.uint8),
        mask=mask,
    )
    if SWIZZLED:
        band = tl.load(band_ptr + (r % 128)[:, None] * KB + b[None, :], mask=block_mask, other=0)
        offset = band + (r // 128)[:, None] * BAND_STRIDE
    else:
        offset = r[:, None] * KB + b[None, :]
    tl.store(scales_ptr + offset, sbyte.to(tl.uint8), mask=block_mask)
