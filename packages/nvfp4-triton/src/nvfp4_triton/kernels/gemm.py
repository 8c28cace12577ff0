"""W4A16 prefill: a tiled GEMM that dequantizes each weight tile inside the K loop.

``y[m, n] = (sum_k x[m, k] * w[n, k]) * row_g[n]`` with no dense weight in memory: every
program computes a ``BLOCK_M x BLOCK_N`` output tile; for each ``BLOCK_K`` chunk of K it
loads the chunk's codes as int32 words ``[BLOCK_K/8, BLOCK_N]`` (already transposed for
``tl.dot``: word ``w`` of column ``n`` at ``codes[n, k0/2 + 4w]``) and one scale byte per
word, decodes each word's 8 codes at once and accumulates eight dots in float32
(:func:`~nvfp4_triton.kernels.common.dot_words`)::

    acc += x[:, k0 + 8w + r] @ value_r[w, :]     for r = 0 .. 7

The decoded values ``e2m1 * e4m3`` are exact in bfloat16 and float16 (at most 2 x 4
significant bits; the smallest, 0.5 * 2^-9, and the largest, 6 * 448, are in range), so
with x in bfloat16 / float16 the tensor-core products are exact and only the float32
summation order differs from the reference. float32 x uses the config's ``FP32_PRECISION``.
A chunk is at least 128 elements (16 words: the inner size of a 16-bit ``tl.dot``).

Programs are numbered in groups of ``GROUP_M`` row tiles: the programs running together
share weight column tiles, which then come from L2.

Grid: ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import dot_words_rows, store_rows

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

    # rows m of x times weight rows n over all of K (dot_words_rows: code words, eight dots
    # per chunk), then the global of each weight row
    acc = dot_words_rows(
        x_ptr + m * stride_xm,
        m_mask,
        codes_ptr,
        scales_ptr,
        n,
        n_mask,
        K,
        K,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        DOT_DTYPE,
        FP32_PRECISION,
    )
    store_rows(acc, row_g_ptr, n, n_mask, out_ptr, m, m_mask, n, n_mask, stride_om)
