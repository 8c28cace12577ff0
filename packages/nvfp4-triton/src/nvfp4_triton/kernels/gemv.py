"""W4A16 decode: ``y[m, n] = (sum_k x[m, k] * w[n, k]) * row_g[n]`` for a few rows of x.

Decode is bound by how fast the weight streams from memory, so the kernel is built around
reading every weight byte once, at full width, from enough programs to fill the GPU:

* a program owns ``BLOCK_N`` weight rows (output columns) and one slice of K; it walks its
  slice in chunks of ``BLOCK_K`` elements (``BLOCK_K / 2`` bytes per row: contiguous,
  coalesced loads), decodes the chunk in registers and multiplies it by all ``BLOCK_M``
  rows of x at once, so the weight is read once whatever M is (up to ``BLOCK_M`` = 16);
* the decode is what the inner loop pays per weight byte, so it is kept minimal: the codes
  become float32 ``e2m1 * 2^-14`` by a few integer operations
  (:func:`~nvfp4_triton.codec.e2m1_pair_scaled`), each 16-element block's products are
  summed first, and the block's E4M3 scale (times ``2^14``, exact) multiplies that sum
  once: one scale decode and one multiply per block and row of x instead of per element;
* **split-K**: when ``N / BLOCK_N`` programs are too few to fill the device, K is cut into
  ``SPLIT_K`` slices (grid axis 1). Each slice writes float32 partial sums to a workspace
  ``[SPLIT_K, M, N]`` and :func:`splitk_reduce_kernel` adds them in slice order (the
  result is deterministic: no atomics), applies the global and rounds to the output dtype.
  Without a split the GEMV kernel does that epilogue itself;
* the even and odd elements of a chunk are multiplied separately by the low and high
  nibbles (no nibble interleaving): ``x[m, 2j] * lo[n, j] + x[m, 2j+1] * hi[n, j]``.

Grid: ``(cdiv(N, BLOCK_N), SPLIT_K)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import E2M1_PAIR_UNSCALE, e2m1_pair_scaled, e4m3_valid_to_f32, round_out

__all__ = ["gemv_kernel", "splitk_reduce_kernel"]


@triton.jit
def gemv_kernel(
    x_ptr,  # [M, K] float32 | float16 | bfloat16, row stride stride_xm, unit column stride
    codes_ptr,  # uint8 [N, K/2]
    scales_ptr,  # uint8 [N, K/16]
    row_g_ptr,  # float32 [N]
    out_ptr,  # PARTIAL: float32 workspace [SPLIT_K, M, N]; else the output [M, N] (stride_om)
    M,
    N,
    K,
    stride_xm,
    stride_om,
    K_SPLIT,  # elements of K per split, a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_K // 2
    BLOCKS: tl.constexpr = BLOCK_K // 16  # 16-element scale blocks per chunk
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)

    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # weight rows = output columns
    n_mask = n < N
    m = tl.arange(0, BLOCK_M).to(tl.int64)  # rows of x
    m_mask = m < M
    j = tl.arange(0, HALF)  # byte j of a chunk: elements 2j (low nibble) and 2j+1 (high)
    b = tl.arange(0, BLOCKS)  # scale block b of a chunk: bytes 8b .. 8b+7

    # This program's slice of K: [k_lo, k_hi). K is a multiple of 16 and k_lo of BLOCK_K,
    # so an element 2j is in range exactly when 2j + 1 is, and a block is either wholly in
    # range or wholly out.
    k_lo = pid_s * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)

    # Loop-invariant parts of the addresses: each weight row's first byte and first scale,
    # each x row's even elements. The chunk at k0 (a multiple of 16) starts at byte k0 // 2
    # and scale k0 // 16 of its rows.
    w_rows = codes_ptr + n[:, None] * (K // 2)
    s_rows = scales_ptr + n[:, None] * (K // 16)
    x_rows = x_ptr + m[:, None] * stride_xm + 2 * j[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_mask = (k0 + 2 * j) < k_hi  # element 2j of the chunk (and so 2j + 1) in range
        w_mask = n_mask[:, None] & k_mask[None, :]
        byte = tl.load(w_rows + (k0 // 2 + j)[None, :], mask=w_mask, other=0)
        lo, hi = e2m1_pair_scaled(byte.to(tl.int32))  # [BLOCK_N, HALF], values * 2^-14

        b_mask = n_mask[:, None] & ((k0 + 16 * b) < k_hi)[None, :]
        sbyte = tl.load(s_rows + (k0 // 16 + b)[None, :], mask=b_mask, other=0)
        scale = e4m3_valid_to_f32(sbyte.to(tl.int32)) * E2M1_PAIR_UNSCALE  # [BLOCK_N, BLOCKS]

        x_mask = m_mask[:, None] & k_mask[None, :]
        x_even = tl.load(x_rows + k0, mask=x_mask, other=0.0).to(tl.float32)  # [BLOCK_M, HALF]
        x_odd = tl.load(x_rows + (k0 + 1), mask=x_mask, other=0.0).to(tl.float32)

        # [BLOCK_M, 1, HALF] x [1, BLOCK_N, HALF]: the products of the chunk; bytes 8b..8b+7
        # are block b, so viewing the last axis as [BLOCKS, 8] and summing it gives each
        # block's dot product, which its scale then multiplies once.
        part = x_even[:, None, :] * lo[None, :, :] + x_odd[:, None, :] * hi[None, :, :]
        per_block = tl.sum(tl.reshape(part, (BLOCK_M, BLOCK_N, BLOCKS, 8)), axis=3)
        acc += tl.sum(per_block * scale[None, :, :], axis=2)

    out_mask = m_mask[:, None] & n_mask[None, :]
    if PARTIAL:
        # workspace[pid_s, m, n]: float32 partial sums; the global waits for the reduction
        ws = out_ptr + (pid_s * M + m[:, None]) * N + n[None, :]
        tl.store(ws, acc, mask=out_mask)
    else:
        g = tl.load(row_g_ptr + n, mask=n_mask, other=0.0)
        y = round_out(acc * g[None, :], out_ptr.dtype.element_ty)
        tl.store(out_ptr + m[:, None] * stride_om + n[None, :], y, mask=out_mask)


@triton.jit
def splitk_reduce_kernel(
    ws_ptr,  # float32 [SPLIT_K, M, N]
    row_g_ptr,  # float32 [N]
    out_ptr,  # [M, N], row stride stride_om
    M,
    N,
    stride_om,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``out[m, n] = round_out((sum_s ws[s, m, n]) * row_g[n])``, slices added in order.
    Grid: ``(M, cdiv(N, BLOCK_N))``."""
    m = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + n, mask=n_mask, other=0.0)
    g = tl.load(row_g_ptr + n, mask=n_mask, other=0.0)
    y = round_out(acc * g, out_ptr.dtype.element_ty)
    tl.store(out_ptr + m * stride_om + n, y, mask=n_mask)
