"""Helpers shared by the tests: the two kernel configs and exact bit comparisons; numpy <->
torch and the reference comparison are :mod:`nvfp4_triton.testing`'s (shared with the cuda
and rocm suites)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4_triton import config as tiles


def bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The raw bits of a float array (for exact, signed-zero-aware comparisons)."""
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


#: 32-lane warps, small tiles (ragged edges everywhere), split-K on.
NVIDIA_LIKE = tiles.KernelConfig(
    name="test-nvidia",
    lanes=32,
    gemv=tiles.GemvTiles(block_n=16, block_k=128, num_warps=4, split_k_programs=8, max_split_k=4),
    gemm=tiles.GemmTiles(block_m=16, block_n=32, block_k=128, group_m=2, num_warps=4),
    dequant=tiles.DequantTiles(block_n=16, block_k=64, num_warps=4),
    quant=tiles.QuantTiles(block_m=8, block_kb=4, num_warps=4),
    gather=tiles.GatherTiles(
        block_m=16, block_n=16, block_k=128, rows_block_n=16, rows_block_k=64, num_warps=4
    ),
    dot_in_float32=True,  # the interpreter's tl.dot mishandles bfloat16 operands
)

#: AMD CDNA-flavoured: 64-lane wavefronts, num_warps chosen for 64 lanes (2 x 64 = 128
#: threads, 4 x 64 = 256), other tile shapes. The kernels are the same source.
AMD_LIKE = tiles.KernelConfig(
    name="test-gfx942",
    lanes=64,
    gemv=tiles.GemvTiles(block_n=32, block_k=64, num_warps=2, split_k_programs=4, max_split_k=8),
    gemm=tiles.GemmTiles(block_m=32, block_n=16, block_k=128, group_m=4, num_warps=4),
    gemm_small=tiles.GemmTiles(block_m=16, block_n=16, block_k=128, group_m=1, num_warps=2),
    small_m=16,
    dequant=tiles.DequantTiles(block_n=8, block_k=128, num_warps=2),
    quant=tiles.QuantTiles(block_m=4, block_kb=8, num_warps=2),
    gather=tiles.GatherTiles(
        block_m=32, block_n=16, block_k=128, rows_block_n=32, rows_block_k=128, num_warps=2
    ),
    dot_in_float32=True,
)
