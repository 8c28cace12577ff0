"""W4A16 decode: ``y[m, n] = (sum_k x[m, k] * w[n, k]) * row_g[n]`` for a few rows of x.

Decode is bound by how fast the weight streams from memory, so the kernel is built around
reading every weight byte once, at full width, from enough programs to fill the GPU, and
spending as few instructions per byte as it can (``benchmarks/triton_sass.py`` counts them
in the compiled code; an H200 at 80 % of its bandwidth can issue about 8.7 per byte):

* a program owns ``BLOCK_N`` weight rows (output columns) and one slice of K; it walks its
  slice in chunks of ``BLOCK_K`` elements and multiplies each decoded chunk by all
  ``BLOCK_M`` rows of x at once, so the weight is read once whatever M is (up to 16);
* the codes are read as little-endian int32 words (8 codes, 2 words per 16-element block)
  and decoded 8 at a time into float32 ``e2m1 * 2^-14``
  (:func:`~nvfp4_triton.codec.e2m1_code_scaled`: a few integer operations per word and a
  float16 -> float32 conversion per code); word ``w`` of block ``b`` holds elements
  ``16 b + 8 w + r``, ``r = 0..7``, multiplied by the matching elements of x;
* a chunk is a ``[BLOCK_N, BLOCKS, 2]`` tensor of words, so a block's two words are one
  thread's: its products are summed inside the thread, its E4M3 scale (times ``2^14``,
  exact) multiplies that sum once, and the result is added to a per-block accumulator
  that is reduced across threads once, after the loop. With one row of x every tensor keeps
  the layout of the word load, so nothing moves between threads inside the loop;
* the whole chunks of a slice are loaded without masks - every address is in range by
  construction: rows past N read row N - 1 and rows of x past M read row 0, whose results
  are never stored - and only the last, partial chunk is masked (a masked load also clears
  its register first, an instruction per element the steady state does not pay). That
  loop is :func:`~nvfp4_triton.kernels.common.stream_rows` (over
  :func:`~nvfp4_triton.kernels.common.stream_chunk`), shared with the MoE per-row gather;
* **split-K**: when ``N / BLOCK_N`` programs are too few to fill the device, K is cut into
  ``SPLIT_K`` slices (grid axis 1). Each slice writes float32 partial sums to a workspace
  ``[SPLIT_K, M, N]`` and :func:`splitk_reduce_kernel` adds them in slice order (the
  result is deterministic: no atomics), applies the global and rounds to the output dtype.
  Without a split the GEMV kernel does that epilogue itself.

Grid: ``(cdiv(N, BLOCK_N), SPLIT_K)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codec import round_out
from .common import store_rows, stream_rows

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
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)

    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # weight rows = output columns
    n_mask = n < N
    m = tl.arange(0, BLOCK_M).to(tl.int64)  # rows of x
    m_mask = m < M

    # This program's slice of K: [k_lo, k_hi). K is a multiple of 16 and k_lo of BLOCK_K,
    # so a 16-element block is either wholly in range or wholly out.
    k_lo = pid_s * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)

    # The slice's K loop, whole chunks unmasked (stream_rows). Rows are clamped into range
    # (weight rows past N to N - 1, rows of x past M to 0; their sums are never stored), so
    # every address is valid whether a load is masked or not.
    n_ld = tl.minimum(n, N - 1)
    m_ld = tl.where(m_mask, m, 0)
    acc2 = stream_rows(
        codes_ptr,
        scales_ptr,
        n_ld,
        x_ptr + m_ld * stride_xm,
        k_lo,
        k_hi,
        K,
        n_mask,
        m_mask,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )  # [BLOCK_M, BLOCK_N]

    if PARTIAL:
        # workspace[pid_s, m, n]: float32 partial sums; the global waits for the reduction
        ws = out_ptr + (pid_s * M + m[:, None]) * N + n[None, :]
        tl.store(ws, acc2, mask=m_mask[:, None] & n_mask[None, :])
    else:
        store_rows(acc2, row_g_ptr, n, n_mask, out_ptr, m, m_mask, n, n_mask, stride_om)


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
