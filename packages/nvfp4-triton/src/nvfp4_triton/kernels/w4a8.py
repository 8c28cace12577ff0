"""W4A8 (spec 1.1, "W4A8"): NVFP4 weights times 8-bit activations.

int8 activations (capability ``w4a8``, ggml's Q8_0 activation path):

* :func:`quantize_q8_kernel` - x ``[M, K]`` -> int8 codes ``[M, K]`` and one float16 ``d``
  per block of 32 along K, bit-identical to :func:`nvfp4.reference.quantize_activations_q8`;
* :func:`w4a8_kernel` - ``y = (sum over 16-blocks j of isum_j * (e4m3(s_j) / 2) * d[m, j // 2])
  * global`` with ``isum_j`` the exact int32 sum of ``2 * e2m1`` (an integer in [-12, 12])
  times the int8 codes, from an int8 ``tl.dot``; the MoE form (``GATHER``) takes the
  rows of one expert from the tile table of :func:`nvfp4_triton.ops.gather`.

FP8 activations (capability ``w4a8_fp8``, ModelOpt's ``W4A8_NVFP4_FP8``):

* :func:`quantize_fp8_kernel` - ``e4m3(x / input_scale)``, RNE, saturating at 448, the NaN
  byte 0x7F for a NaN or an infinity, bit-identical to
  :func:`nvfp4.reference.quantize_activations_fp8`;
* :func:`w4a8_fp8_kernel` - ``y = (sum_k e4m3(xcode) * e2m1 * e4m3(scale)) * input_scale *
  global``: the E2M1 codes are FP8 E4M3 values exactly (0, 0.5 .. 6), so the product runs
  as an FP8 ``tl.dot`` with float32 accumulation; the weight's block scale multiplies each
  16-block's float32 sum, ``input_scale`` and the global the accumulator at the end.

**Why two dots per 32 elements.** An 8-bit ``tl.dot`` needs an inner size of at least 32
on NVIDIA (``mma`` ``k32``), but the weight's E4M3 scale changes every 16 elements of K and
differs per output column, so it cannot be applied inside a dot that spans two blocks. Each
32-element step therefore runs two dots with the same activation tile: one against the
weight with its second 16-block zeroed (``isum`` of block ``2b``), one with its first
zeroed (block ``2b + 1``). Every product is exact (int8 x int8 into int32; E4M3 x E2M1 into
float32 over 16 non-zero terms, exact as well), so the only roundings are the float32
terms and their sum, which ``[w4a8]`` / ``[w4a8_fp8]`` bound.

Layout conventions are those of :mod:`nvfp4_triton.kernels` (canonical planes, ``row_g``
per weight row, expert ``e`` at rows ``e * N``). Element ``k`` of a weight row is the low
nibble of byte ``k // 2`` when ``k`` is even, the high one when odd; the kernels load each
byte for both of its elements (the second load hits the cache) rather than interleave
nibbles in registers. Every load and store is masked; offsets that scale with a tensor
size are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl
from nvfp4.spec import E4M3_MAX, E4M3_NAN_BYTE, Q8_BLOCK_SIZE, Q8_MAX

from ..codec import e4m3_rne, e4m3_valid_to_f32, round_out
from .common import grouped_tile, store_rows

__all__ = [
    "quantize_fp8_kernel",
    "quantize_q8_kernel",
    "w4a8_fp8_kernel",
    "w4a8_kernel",
]

_QB = tl.constexpr(Q8_BLOCK_SIZE)  # 32 activation elements per Q8 block
_Q8_MAX = tl.constexpr(float(Q8_MAX))  # 127
_FP8_MAX = tl.constexpr(float(E4M3_MAX))  # 448
_NAN_BYTE = tl.constexpr(E4M3_NAN_BYTE)  # 0x7F
_F16_NAN_BITS = tl.constexpr(0x7E00)  # the float16 NaN numpy writes (np.float16(np.nan))


# ------------------------------------------------------------------------- encoders
@triton.jit
def _finite(v):
    """Not NaN and not an infinity (float32)."""
    return (v == v) & (tl.abs(v) != float("inf"))


@triton.jit
def quantize_q8_kernel(
    x_ptr,  # [M, K] float32 | float16 | bfloat16, row stride stride_xm, unit column stride
    codes_ptr,  # int8 [M, K]
    d_ptr,  # int16 [M, K/32]: the float16 bits of d (written as bits: NaN is pinned)
    ids_ptr,  # HAS_IDS: int64 [M] expert ids (else unused)
    M,
    K,
    E,
    stride_xm,
    BLOCK_M: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    HAS_IDS: tl.constexpr,
):
    """ggml's ``quantize_row_q8_0_ref`` per block of 32, every operation float32:
    ``amax``; ``d = amax / 127``; ``id = 1 / d`` (0 where ``d == 0``); ``code =
    roundf(x * id)`` (half away from zero); ``d`` stored as float16 with RNE. A block
    holding NaN or Inf gets zero codes and ``d`` NaN. ``HAS_IDS`` (the MoE form): a row
    whose expert id lies outside ``[0, E)`` is not read at all and encodes as zeros (the
    matmul never reads it either). Grid: ``(cdiv(M, BLOCK_M), cdiv(K/32, BLOCK_KB))``."""
    KB = K // _QB  # Q8 blocks per row
    r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x
    b = tl.program_id(1).to(tl.int64) * BLOCK_KB + tl.arange(0, BLOCK_KB)  # Q8 blocks
    e = tl.arange(0, _QB)  # element e of a block: column 32 b + e
    block_mask = (r < M)[:, None] & (b < KB)[None, :]  # [BLOCK_M, BLOCK_KB]: written
    read = block_mask
    if HAS_IDS:
        rid = tl.load(ids_ptr + r, mask=r < M, other=-1)
        read = read & ((rid >= 0) & (rid < E))[:, None]  # routed rows only
    mask = block_mask[:, :, None]  # [BLOCK_M, BLOCK_KB, 1], broadcast over the 32 elements

    col = b[None, :, None] * _QB + e[None, None, :]  # [1, BLOCK_KB, 32]
    x = tl.load(x_ptr + r[:, None, None] * stride_xm + col, mask=read[:, :, None], other=0.0)
    x = x.to(tl.float32)

    # Non-finite elements stay out of the amax (numpy's where(finite, x, 0)); their block
    # is flagged and written as zero codes and d = NaN at the end.
    fin = _finite(x)
    x = tl.where(fin, x, 0.0)
    bad = tl.max((~fin).to(tl.int32), axis=2) > 0  # [BLOCK_M, BLOCK_KB]

    amax = tl.max(tl.abs(x), axis=2)  # [BLOCK_M, BLOCK_KB]
    d = tl.math.div_rn(amax, _Q8_MAX)  # one correctly rounded division (not rcp.approx)
    inv = tl.where(d == 0.0, 0.0, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), d))
    v = x * inv[:, :, None]  # one float32 multiplication
    # 0 * inf (a d below 2^-128 has id = inf) is NaN: the reference's cast of that NaN
    # gives code 0, and x * inf = +-inf saturates to +-127 (np.clip). tl.minimum would
    # drop a NaN on a GPU and keep it under the interpreter, so NaN is cleared first.
    v = tl.where(v == v, v, 0.0)
    a = tl.minimum(tl.abs(v), _Q8_MAX)  # in [0, 127]
    # roundf: |v| truncated (exact, a < 2^23), plus one where the exact remainder is at
    # least 1/2 - halfway cases away from zero, with no float32 rounding anywhere.
    t = a.to(tl.int32)
    q = t + ((a - t.to(tl.float32)) >= 0.5).to(tl.int32)
    q = tl.where(v < 0.0, -q, q)
    q = tl.where(bad[:, :, None], 0, q)

    # d as float16 with RNE (above 65504 it rounds to inf, as ggml_fp32_to_fp16), stored as
    # its bits so a non-finite block's NaN is numpy's 0x7E00 on every device.
    d_bits = d.to(tl.float16).to(tl.int16, bitcast=True)
    d_bits = tl.where(bad, _F16_NAN_BITS, d_bits.to(tl.int32)).to(tl.int16)

    tl.store(codes_ptr + r[:, None, None] * K + col, q.to(tl.int8), mask=mask)
    tl.store(d_ptr + r[:, None] * KB + b[None, :], d_bits, mask=block_mask)


@triton.jit
def quantize_fp8_kernel(
    x_ptr,  # [M, K] float32 | float16 | bfloat16, row stride stride_xm
    scale_ptr,  # float32 [1]: input_scale (static, or amax / 448 from the wrapper)
    codes_ptr,  # uint8 [M, K]: float8_e4m3fn bytes
    M,
    K,
    stride_xm,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``code = e4m3(x / input_scale)``: one correctly rounded float32 division, the
    magnitude clamped to 448, E4M3 with RNE (subnormals: multiples of 2^-9; below 2^-10
    zero), the sign bit that of the quotient (so -0.0 gives 0x80); NaN or Inf in x gives
    0x7F. Grid: ``(cdiv(M, BLOCK_M), cdiv(K, BLOCK_K))``."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (r < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + r[:, None] * stride_xm + k[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    fin = _finite(x)
    s = tl.load(scale_ptr)
    v = tl.math.div_rn(tl.where(fin, x, 0.0), s)  # may overflow to +-inf: saturates below
    mag = tl.minimum(tl.abs(v), _FP8_MAX)  # v is never NaN (finite / finite > 0)
    # e4m3_rne rounds any float32 in [0, 448]: its subnormal branch rint(mag * 512) gives
    # 0 below 2^-10 and at 2^-10 itself (the tie goes to the even 0).
    byte, _ = e4m3_rne(mag)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1  # signbit of the quotient
    byte = byte | (sign << 7)
    byte = tl.where(fin, byte, _NAN_BYTE)
    tl.store(codes_ptr + r[:, None] * K + k[None, :], byte.to(tl.uint8), mask=mask)


# --------------------------------------------------------------------- weight decode
@triton.jit
def _e2m1_doubled(code):
    """E2M1 codes (int32, 0..15) -> ``2 * e2m1`` as int32 in [-12, 12], exactly.

    The magnitude index ``i = code & 7`` orders 0, 0.5, 1, 1.5, 2, 3, 4, 6, doubled
    0, 1, 2, 3, 4, 6, 8, 12: ``i`` itself below 2, else ``(2 + (i & 1)) << (i // 2 - 1)``
    (2, 3, 4, 6, 8, 12 for i = 2..7; ggml's ``kvalues_mxfp4``). Bit 3 is the sign."""
    i = code & 7
    shift = tl.maximum((i >> 1) - 1, 0)
    mag = tl.where(i < 2, i, (2 + (i & 1)) << shift)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def _weight_block(codes_ptr, scales_ptr, w_row, n_ok, kb, K, k_hi):
    """The 32-element step ``kb`` (elements ``32 kb .. 32 kb + 31``) of weight rows ``w_row``
    (``[BLOCK_N]`` int64, read where ``n_ok``) up to element ``k_hi`` (exclusive; K, or 0
    for a tile that reads nothing): the E2M1 codes as a ``[32, BLOCK_N]`` int32 tensor
    (element ``e`` of the step in row ``e``: the ``tl.dot`` operand is ``[K, N]``) and the
    two float32 scales ``[BLOCK_N]`` of its 16-blocks ``2 kb`` and ``2 kb + 1``. Elements
    and blocks at or past ``k_hi`` (the second half of the last step when K is an odd
    multiple of 16: FP8 takes any multiple of 16) load code 0 and scale byte 0 (0.0)."""
    e = tl.arange(0, _QB)
    e_ok = (kb * _QB + e) < k_hi  # [32]
    # element 32 kb + e lives in byte 16 kb + e // 2 of the row (K / 2 bytes), low nibble
    # for even e, high for odd
    byte_ptr = codes_ptr + w_row[None, :] * (K // 2) + (kb * 16 + e // 2)[:, None]
    byte = tl.load(byte_ptr, mask=e_ok[:, None] & n_ok[None, :], other=0).to(tl.int32)
    code = (byte >> ((e & 1) * 4)[:, None]) & 15
    # scale of 16-block 2 kb, then 2 kb + 1; the block bounds as per-row tensors
    # (`tensor & scalar` is mistyped by the interpreter)
    s_ptr = scales_ptr + w_row * (K // 16) + 2 * kb
    first = w_row * 0 + kb * _QB  # element 0 of block 2 kb, per row
    s0 = tl.load(s_ptr, mask=n_ok & (first < k_hi), other=0).to(tl.int32)
    s1 = tl.load(s_ptr + 1, mask=n_ok & (first + 16 < k_hi), other=0).to(tl.int32)
    return code, e4m3_valid_to_f32(s0), e4m3_valid_to_f32(s1)


@triton.jit
def _halves(w, zero):
    """``w [32, BLOCK_N]`` split into two operands of the same shape: the first 16 rows
    (16-block ``2 kb``) with the rest ``zero``, and the last 16 (block ``2 kb + 1``)."""
    first = (tl.arange(0, _QB) < 16)[:, None]
    return tl.where(first, w, zero), tl.where(first, zero, w)


# -------------------------------------------------------------------- int8 matmul
@triton.jit
def _w4a8_tile(
    xq_ptr,  # int8 [M, K] codes
    d_ptr,  # float16 [M, K/32]
    codes_ptr,
    scales_ptr,
    row,  # [BLOCK_M] int64: rows of x (safe addresses)
    row_ok,  # [BLOCK_M]: rows to read
    w_row,  # [BLOCK_N] int64: weight rows (safe addresses)
    n_ok,  # [BLOCK_N]: weight rows to read
    k_end,  # K, or 0 for a tile that reads nothing
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUB: tl.constexpr,
):
    """The float32 accumulator ``[BLOCK_M, BLOCK_N]`` of ``sum_j isum_j * (e4m3(s_j) / 2)
    * d[m, j // 2]`` over K (the global not yet applied). The loop takes ``SUB`` Q8 blocks
    per iteration (a chunk of ``32 * SUB`` elements); a block past ``k_end`` is masked."""
    KB = K // _QB
    e = tl.arange(0, _QB)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb0 in range(0, k_end // _QB, SUB):
        for sub in tl.static_range(SUB):
            kb = kb0 + sub  # Q8 block of this step
            # block kb in range, as per-row / per-column bounds (`tensor & scalar` is
            # mistyped by the interpreter)
            m_ok = row_ok & ((row * 0 + kb * _QB) < k_end)
            # activation codes [BLOCK_M, 32] and d [BLOCK_M] of block kb
            xq = tl.load(
                xq_ptr + row[:, None] * K + (kb * _QB + e)[None, :], mask=m_ok[:, None], other=0
            )
            d = tl.load(d_ptr + row * KB + kb, mask=m_ok, other=0.0).to(tl.float32)
            code, s0, s1 = _weight_block(codes_ptr, scales_ptr, w_row, n_ok, kb, K, k_end)
            w_lo, w_hi = _halves(_e2m1_doubled(code), 0)
            w_lo, w_hi = w_lo.to(tl.int8), w_hi.to(tl.int8)
            # isum_j exact in int32 (|isum_j| <= 16 * 12 * 127 = 24384)
            isum0 = tl.dot(xq, w_lo, out_dtype=tl.int32)
            isum1 = tl.dot(xq, w_hi, out_dtype=tl.int32)
            # the spec's terms: isum_j * (e4m3(s_j) / 2) (exact: 15 x 4 significant bits),
            # then * d (the one rounding); added into the float32 accumulator
            acc += (isum0.to(tl.float32) * (s0 * 0.5)[None, :]) * d[:, None]
            acc += (isum1.to(tl.float32) * (s1 * 0.5)[None, :]) * d[:, None]
    return acc


@triton.jit
def w4a8_kernel(
    xq_ptr,  # int8 [M, K]: Q8 codes (quantize_q8_kernel)
    d_ptr,  # float16 [M, K/32]
    ids_ptr,  # GATHER: int32 | int64 [M] expert ids (else unused)
    perm_ptr,  # GATHER and HAS_PERM: int64 [M], row of x at each sorted position
    tiles_ptr,  # GATHER: int64 [T, 3], tile t's expert (E: unused), first position, end
    codes_ptr,  # uint8 [E? * N, K/2]
    scales_ptr,  # uint8 [E? * N, K/16]
    row_g_ptr,  # float32 [E? * N]
    out_ptr,  # [M, N], row stride stride_om (GATHER: zero-filled by the wrapper)
    M,
    N,
    K,
    E,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUB: tl.constexpr,
    GATHER: tl.constexpr,
    HAS_PERM: tl.constexpr,
):
    """W4A8 int8 ``y = acc * global`` (:func:`_w4a8_tile`).

    Plain (``GATHER`` false): grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``, rows
    ``pid_m * BLOCK_M ..`` of x. MoE (``GATHER``): grid ``(T, cdiv(N, BLOCK_N))`` over the
    tile table of :func:`nvfp4_triton.ops._grouped_tiles`, as the W4A16 grouped gather
    (:func:`~nvfp4_triton.kernels.common.grouped_tile`): tile ``t`` holds up to ``BLOCK_M``
    rows routed to its expert; each row's
    own id is read back and must name that expert, an unused tile (expert ``E``) and a row
    of another expert read and write nothing, and an id outside ``[0, E)`` never forms an
    address (the rows of such ids stay the wrapper's zeros)."""
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns
    n_mask = n < N
    if GATHER:
        row, row_ok, w_row, n_ok, k_end = grouped_tile(
            tiles_ptr, perm_ptr, ids_ptr, n, N, K, E, BLOCK_M, HAS_PERM
        )
    else:
        row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = row < M
        n_ok = n_mask
        k_end = K
        w_row = n
    acc = _w4a8_tile(
        xq_ptr,
        d_ptr,
        codes_ptr,
        scales_ptr,
        row,
        row_ok,
        w_row,
        n_ok,
        k_end,
        K,
        BLOCK_M,
        BLOCK_N,
        SUB,
    )
    store_rows(acc, row_g_ptr, w_row, n_ok, out_ptr, row, row_ok, n, n_mask, stride_om)


# --------------------------------------------------------------------- FP8 matmul
@triton.jit
def _e2m1_as_e4m3(code):
    """E2M1 codes (int32, 0..15) -> the E4M3 bytes of the same values (int32), exactly.

    E4M3 (bias 7) holds every E2M1 value: index ``i = code & 7`` >= 2 is ``2^(e-1) *
    (1 + m/2)`` with ``i = 2e + m``, the E4M3 byte ``(e + 6) << 3 | m << 2``, i.e.
    ``(i + 12) << 2``; ``i = 1`` (0.5 = 2^-1) is ``6 << 3 = 0x30``; ``i = 0`` is 0.
    The sign moves from bit 3 to bit 7."""
    i = code & 7
    mag = tl.where(i >= 2, (i + 12) << 2, tl.where(i == 1, 0x30, 0))
    return mag | ((code & 8) << 4)


@triton.jit
def w4a8_fp8_kernel(
    xq_ptr,  # uint8 [M, K]: float8_e4m3fn codes (quantize_fp8_kernel)
    scale_ptr,  # float32 [1]: input_scale
    codes_ptr,  # uint8 [N, K/2]
    scales_ptr,  # uint8 [N, K/16]
    row_g_ptr,  # float32 [N]
    out_ptr,  # [M, N], row stride stride_om
    M,
    N,
    K,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUB: tl.constexpr,
):
    """W4A8 FP8: ``y = (sum_j s_j * sum_{k in j} e4m3(x) * e2m1) * input_scale * global``.

    The activation codes and the weight's E2M1 values (as E4M3 bytes) are bitcast to
    ``float8e4nv`` and multiplied by an FP8 ``tl.dot`` into float32. The backends launch
    it only where FP8 tensor cores exist (NVIDIA compute capability 8.9 and later, AMD
    gfx942 / gfx950: ``w4a8_fp8`` is not declared elsewhere, and nothing emulates it) and
    under the Triton interpreter, whose FP8 ``tl.dot`` widens both operands to float16
    (exact: every E4M3 value is a float16) and multiplies them in float32. The products
    are exact, and so is each 16-block's sum (16 terms of at most 8 significant bits).

    Grid: ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``."""
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < M
    n_ok = n < N
    e = tl.arange(0, _QB)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    seen_nan = tl.zeros((BLOCK_M, _QB), dtype=tl.int32)  # element-wise, reduced once at the end
    # K is a multiple of 16, not necessarily of 32: the last step may be half a step, its
    # second 16-block masked off element by element
    for kb0 in range(0, tl.cdiv(K, _QB), SUB):
        for sub in tl.static_range(SUB):
            kb = kb0 + sub  # 32-element step kb: elements 32 kb .. 32 kb + 31
            xb = tl.load(
                xq_ptr + m[:, None] * K + (kb * _QB + e)[None, :],
                mask=m_ok[:, None] & ((kb * _QB + e) < K)[None, :],
                other=0,
            )  # [BLOCK_M, 32] E4M3 bytes
            seen_nan = tl.maximum(seen_nan, ((xb & 0x7F) == _NAN_BYTE).to(tl.int32))
            code, s0, s1 = _weight_block(codes_ptr, scales_ptr, n, n_ok, kb, K, K)
            wb = _e2m1_as_e4m3(code).to(tl.uint8)  # [32, BLOCK_N] E4M3 bytes
            xa = xb.to(tl.float8e4nv, bitcast=True)
            w_lo, w_hi = _halves(wb, 0)
            w_lo = w_lo.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
            w_hi = w_hi.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
            # one 16-block's exact sum per dot, then its block scale
            p0 = tl.dot(xa, w_lo, out_dtype=tl.float32)
            p1 = tl.dot(xa, w_hi, out_dtype=tl.float32)
            acc += p0 * s0[None, :]
            acc += p1 * s1[None, :]
    s = tl.load(scale_ptr)
    g = tl.load(row_g_ptr + n, mask=n_ok, other=0.0)
    # both scales after accumulation: input_scale * global of the row, then the product
    y = acc * (s * g)[None, :]
    # A NaN code (x held NaN or Inf) makes its whole row NaN, as the spec says. Set here,
    # not left to the dot: the interpreter widens the byte 0x7F to 480, not to NaN.
    y = tl.where((tl.max(seen_nan, axis=1) > 0)[:, None], float("nan"), y)
    y = round_out(y, out_ptr.dtype.element_ty)
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], y, mask=m_ok[:, None] & n_ok[None, :])
