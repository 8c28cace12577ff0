"""Helpers shared by the tests: numpy <-> torch, reference comparisons."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import torch
from nvfp4.tolerances import tolerance
from nvfp4_triton.config import (
    DequantTiles,
    GatherTiles,
    GemmTiles,
    GemvTiles,
    KernelConfig,
    QuantTiles,
)

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
DTYPES = list(TORCH)


def to_numpy(t: Any) -> npt.NDArray[Any]:
    """A tensor as numpy (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def x_of(
    rng: np.random.Generator, m: int, k: int, dtype: str
) -> tuple[Any, npt.NDArray[np.float32]]:
    """Activations in ``dtype`` (torch) and the same values as float32 numpy."""
    x = (rng.standard_normal((m, k)) * np.exp(rng.normal(0, 1, (m, 1)))).astype(np.float32)
    xt = torch.from_numpy(x).to(TORCH[dtype])
    return xt, xt.float().numpy()


def check_close(y: Any, ref: npt.NDArray[Any], path: str, dtype: str, what: str) -> float:
    """Assert spec 1.0's ``max|y - ref| / max|ref| <= tolerance(path, dtype)``; return it."""
    yn = to_numpy(y).astype(np.float64)
    assert yn.shape == ref.shape, f"{what}: shape {yn.shape}, expected {ref.shape}"
    assert np.isfinite(yn).all(), f"{what}: non-finite output"
    scale = float(np.abs(ref).max())
    err = float(np.abs(yn - ref).max()) / scale if scale else float(np.abs(yn).max())
    tol = tolerance(path, dtype)
    assert err <= tol, f"{what}: max|err|/max|ref| = {err:.3g} > {tol:g}"
    return err


def bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The raw bits of a float array (for exact, signed-zero-aware comparisons)."""
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


#: 32-lane warps, small tiles (ragged edges everywhere), split-K on.
NVIDIA_LIKE = KernelConfig(
    name="test-nvidia",
    lanes=32,
    gemv=GemvTiles(block_n=16, block_k=128, num_warps=4, split_k_programs=8, max_split_k=4),
    gemm=GemmTiles(block_m=16, block_n=32, block_k=128, group_m=2, num_warps=4),
    dequant=DequantTiles(block_n=16, block_k=64, num_warps=4),
    quant=QuantTiles(block_m=8, block_kb=4, num_warps=4),
    gather=GatherTiles(
        block_m=16, block_n=16, block_k=128, rows_block_n=16, rows_block_k=64, num_warps=4
    ),
    dot_in_float32=True,  # the interpreter's tl.dot mishandles bfloat16 operands
)

#: AMD CDNA-flavoured: 64-lane wavefronts, num_warps chosen for 64 lanes (2 x 64 = 128
#: threads, 4 x 64 = 256), other tile shapes. The kernels are the same source.
AMD_LIKE = KernelConfig(
    name="test-gfx942",
    lanes=64,
    gemv=GemvTiles(block_n=32, block_k=64, num_warps=2, split_k_programs=4, max_split_k=8),
    gemm=GemmTiles(block_m=32, block_n=16, block_k=128, group_m=4, num_warps=4),
    gemm_small=GemmTiles(block_m=16, block_n=16, block_k=128, group_m=1, num_warps=2),
    small_m=16,
    dequant=DequantTiles(block_n=8, block_k=128, num_warps=2),
    quant=QuantTiles(block_m=4, block_kb=8, num_warps=2),
    gather=GatherTiles(
        block_m=32, block_n=16, block_k=128, rows_block_n=32, rows_block_k=128, num_warps=2
    ),
    dot_in_float32=True,
)
