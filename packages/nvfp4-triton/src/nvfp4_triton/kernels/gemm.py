"""W4A16 prefill: a tiled GEMM that dequantizes each weight tile inside the K loop.

``y[m, n] = (sum_k x[m, k] * w[n, k]) * row_g[n]`` with no dense weight in memory: every
program computes a ``BLOCK_M x BLOCK_N`` output tile; for each ``BLOCK_K`` chunk of K it
loads the chunk's packed bytes and scales ``[BLOCK_K/2, BLOCK_N]`` (already transposed for
``tl.dot``: byte ``j`` of column ``n`` at ``codes[n, k0/2 + j]``), decodes them in registers
to ``DOT_DTYPE`` and accumulates two dots in float32::

    acc += x[:, even k] @ lo   and   acc += x[:, odd k] @ hi

The decoded values are exact in bfloat16 and float16 (see
:func:`~nvfp4_triton.kernels.common.decode_pair`), so with x in bfloat16 / float16 the
tensor-core products are exact and only the float32 summation order differs from the
reference. float32 x uses the config's ``FP32_PRECISION``.

Programs are numbered in groups of ``GROUP_M`` row tiles: the programs running together
share weight column tiles, which then come from L2.

Grid: ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import round_out
from .common import decode_pair, dot_acc

__all__ = ["gemm_kernel"]


@triton.jit
def gemm_kernel(
    x_ptr,  # [M, K], row stride stride_xm
    codes_ptr,  # uint8 [N, K/2]
    scales_ptr,  # uint8 [N, K/16]
    row_g_ptr,  # float32 [N]
    out_ptr,  # [M, N], row stride stride_om
    M,
    N,
    K,
    stride_xm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP32_PRECISION: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_K // 2
    # Grouped program order: GROUP_M consecutive row tiles sweep the column tiles together.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    j = tl.arange(0, HALF)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        col = k0 + 2 * j  # the even element of byte j
        k_mask = col < K
        x_mask = m_mask[:, None] & k_mask[None, :]
        x_even_ptr = x_ptr + m[:, None] * stride_xm + col[None, :]
        x_even = tl.load(x_even_ptr, mask=x_mask, other=0.0).to(DOT_DTYPE)  # [BLOCK_M, HALF]
        x_odd = tl.load(x_even_ptr + 1, mask=x_mask, other=0.0).to(DOT_DTYPE)

        w_mask = k_mask[:, None] & n_mask[None, :]
        byte = tl.load(
            codes_ptr + n[None, :] * (K // 2) + (col // 2)[:, None], mask=w_mask, other=0
        )  # [HALF, BLOCK_N]
        sbyte = tl.load(
            scales_ptr + n[None, :] * (K // 16) + (col // 16)[:, None], mask=w_mask, other=0
        )
        w_even, w_odd = decode_pair(byte.to(tl.int32), sbyte.to(tl.int32))
        acc = dot_acc(x_even, w_even.to(DOT_DTYPE), acc, FP32_PRECISION)
        acc = dot_acc(x_odd, w_odd.to(DOT_DTYPE), acc, FP32_PRECISION)

    g = tl.load(row_g_ptr + n, mask=n_mask, other=0.0)
    y = round_out(acc * g[None, :], out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + m[:, None] * stride_om + n[None, :],
        y,
        mask=m_mask[:, None] & n_mask[None, :],
    )
