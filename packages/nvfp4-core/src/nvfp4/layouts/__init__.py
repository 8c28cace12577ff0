"""Lossless layout transcoders between the canonical NVFP4 planes and other layouts.

Every transcode moves bytes only (views, nibble shuffles, a reciprocal of the global): none
decodes to a dense float matrix, and every one has an inverse with
``inverse(forward(p)) == p`` byte for byte (the compressed-tensors global within 1 ulp).

================== ========================= ========================= ========================
layout             codes                     block scales              global
================== ========================= ========================= ========================
canonical /        ``weight`` U8             ``weight_scale`` F8_E4M3  ``weight_scale_2`` F32
ModelOpt HF        ``[N, K/2]``: element 2j  ``[N, K/16]``: one byte   ``()``: the DECODE
(:mod:`.modelopt`) in the low nibble, 2j+1   per 16 elements along K,  multiplier
                   in the high               row-major
compressed-tensors ``weight_packed`` U8:     ``weight_scale``: the     ``weight_global_scale``
(:mod:`.compressed the same bytes            same bytes                F32 ``[1]``: ENCODE =
_tensors`)                                                             ``float32(1/float64(d))``
MLX native         ``weight`` uint32         ``scales`` uint8          a sidecar decode global
(:mod:`.mlx`)      ``[N, K/8]``: the same    ``[N, K/16]``: the same   applied after the
                   bytes read little-endian, bytes                     matmul; MLX's own
                   element i at bits                                   ``global_scale`` arg is
                   4i..4i+3 of a word                                  the amax = decode*2688
GGUF ``NVFP4``     ``[N, K/64*36]``: per 64  the 4 leading bytes of    ``<name>.scale`` F32
(ggml type 40,     elements, 4 scale bytes   each super-block,         ``[1]`` (``[E]`` for
:mod:`.gguf`)      then 32 code bytes; byte  ``& 0x7F``                experts), multiplied
                   8s+j holds element j                                after the matmul
                   (low) and j+8 (high) of
                   16-group s; K % 64 == 0
128x4 swizzle      unchanged                 rows padded to 128, cols  unchanged
(:mod:`.swizzle`)                            to 4 (pad bytes 0), 512-
                                             byte tiles at
                                             ``spec.swizzle_128x4_
                                             offset``
================== ========================= ========================= ========================

Expert-stacked planes ``[E, N, K]`` carry a global of shape ``(E,)`` in every layout. Fused
planes (``partitions``) are refused by the per-projection checkpoint layouts (ModelOpt,
compressed-tensors) and, unless all partition globals are equal, by GGUF: split them with
:func:`nvfp4.fusion.unfuse` (or give them one global with the explicit, lossy
:func:`nvfp4.fusion.reconcile_globals`). MLX keeps the per-partition global as its sidecar.
"""

from __future__ import annotations

from .compressed_tensors import (
    decode_global,
    encode_global,
    from_compressed_tensors,
    input_global_scale_from_input_scale,
    input_scale_from_input_global_scale,
    to_compressed_tensors,
)
from .gguf import GGUF_TYPE, from_gguf, to_gguf
from .mlx import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from .modelopt import INPUT_SCALE, WEIGHT, WEIGHT_SCALE, WEIGHT_SCALE_2, from_modelopt, to_modelopt
from .swizzle import swizzle_scales, swizzled_size, unswizzle_scales

__all__ = [
    "GGUF_TYPE",
    "INPUT_SCALE",
    "WEIGHT",
    "WEIGHT_SCALE",
    "WEIGHT_SCALE_2",
    "MLXPlanes",
    "decode_global",
    "encode_global",
    "from_compressed_tensors",
    "from_gguf",
    "from_mlx",
    "from_modelopt",
    "input_global_scale_from_input_scale",
    "input_scale_from_input_global_scale",
    "mlx_global_scale_arg",
    "swizzle_scales",
    "swizzled_size",
    "to_compressed_tensors",
    "to_gguf",
    "to_mlx",
    "to_modelopt",
    "unswizzle_scales",
]
