"""The shared NVFP4 Triton kernels (importing this imports triton).

Each module holds one kernel family, every tile a ``tl.constexpr`` chosen by the backend:

* :mod:`.common` - helpers shared by the matmul kernels: ``dot_acc`` (``tl.dot`` with the
  right float32 precision), ``dot_words`` (a K chunk given as int32 code words, decoded 8
  per word and multiplied into a tensor-core accumulator) and ``stream_chunk`` (one K
  chunk of the streaming kernels, GEMV and the MoE per-row gather);
* :mod:`.dequantize` - planes -> dense float32 / float16 / bfloat16;
* :mod:`.gemv` - W4A16 decode, split-K, and its fixed-order split reduction;
* :mod:`.gemm` - W4A16 prefill, weight tiles dequantized inside the K loop;
* :mod:`.gather` - MoE ``gather_qmm``, per-row (unsorted) and grouped-by-expert (sorted);
* :mod:`.quantize` - activation quantization, linear or 128x4-swizzled scales.

Conventions shared by all of them:

* canonical planes: ``codes`` uint8 ``[rows, K/2]`` (element ``2j`` in the low nibble of
  byte ``j``), ``scales`` uint8 ``[rows, K/16]``, and ``row_g`` float32 ``[rows]``, the
  global of every weight row (per tensor, per partition or per expert, expanded once by
  :mod:`nvfp4_triton.weights`); expert ``e`` owns rows ``e*N .. e*N+N-1``;
* a byte ``j`` of a K chunk holds elements ``2j`` and ``2j+1``: the kernels never
  interleave nibbles; they multiply the even elements of x by the low nibbles and the odd
  ones by the high nibbles. Both nibbles of a byte share the scale of block ``2j // 16``;
* stores are masked to the output; loads are masked where an address can leave its
  tensor: the streaming kernels (GEMV, per-row gather) load whole K chunks without masks,
  with rows past N / M clamped to the last valid row (their sums are never stored), and
  mask only the last, partial chunk; per-row scalars (the global, an expert id, a tile's
  expert and row range) are loaded unmasked; an invalid expert id never forms an address:
  it is replaced by 0 and its K and N bounds are 0, so its row loads nothing (the gather
  writes zeros there); offsets that scale with a tensor size are int64;
* the global multiplies the float32 accumulator once, after the K loop;
* outputs are rounded to their dtype with round-to-nearest-even (:func:`~nvfp4_triton.codec.round_out`).
"""
