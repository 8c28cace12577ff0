"""W4A16 qmm through the three paths (GEMV with and without split-K, GEMM, dequantize +
torch.matmul) against the float64 reference, at ragged shapes, with fused partitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4_triton import ops
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.testing import DTYPES, TORCH, check_close, to_numpy, torch_activations
from nvfp4_triton.weights import upload

# (M, N, K): M = 1, 3, 33 (and 16 / 17 around the GEMV's row limit), N not a multiple of
# any tile, K not a multiple of BLOCK_K.
SHAPES = [(1, 45, 208), (3, 7, 64), (16, 33, 96), (17, 20, 80), (33, 45, 208)]


def _weight(rng: np.random.Generator, n: int, k: int, parts=None):
    w = rng.standard_normal((n, k)).astype(np.float32) * np.exp(rng.normal(0, 0.7, (n, 1))).astype(
        np.float32
    )
    if parts is not None:
        for i, (a, b) in enumerate(itertools.pairwise(parts)):
            w[a:b] *= np.float32(4.0**i)
    return reference.quantize(w, partitions=parts, name="w")


@pytest.mark.parametrize("path", ops.QMM_PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES, ids=[f"M{m}_N{n}_K{k}" for m, n, k in SHAPES])
def test_qmm_paths(cfg: KernelConfig, path: str, dtype: str, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    planes = _weight(rng, n, k)
    x, x32 = torch_activations(rng, m, k, dtype)
    y = ops.qmm(x, upload(planes, "cpu"), TORCH[dtype], cfg, path)
    assert y.dtype == TORCH[dtype]
    check_close(y, reference.qmm(x32, planes, out_dtype=None), "qmm", dtype, f"{path} {dtype}")


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_fused_partitions_keep_their_globals(any_cfg: KernelConfig, path: str) -> None:
    """q/k/v-like partitions with globals 16x apart: each output column gets its own."""
    rng = np.random.default_rng(11)
    parts = (0, 5, 21, 24)
    planes = _weight(rng, 24, 96, parts)
    assert len(set(planes.global_scale.tolist())) == 3
    x, x32 = torch_activations(rng, 3, 96, "float32")
    y = ops.qmm(x, upload(planes, "cpu"), torch.float32, any_cfg, path)
    check_close(y, reference.qmm(x32, planes, out_dtype=None), "qmm", "float32", path)


def test_split_k_is_used_and_deterministic(cfg: KernelConfig) -> None:
    """N = 16 is one program: the config's split-K target cuts K into 4 slices, reduced in
    order, so two runs agree to the bit."""
    rng = np.random.default_rng(5)
    planes = _weight(rng, 16, 512)
    w = upload(planes, "cpu")
    x, x32 = torch_activations(rng, 2, 512, "float32")
    y1, y2 = ops.gemv(x, w, torch.float32, cfg), ops.gemv(x, w, torch.float32, cfg)
    assert torch.equal(y1, y2)
    check_close(y1, reference.qmm(x32, planes, out_dtype=None), "qmm", "float32", "split-K")
    no_split = cfg.with_(gemv=type(cfg.gemv)(block_n=16, block_k=128, split_k_programs=0))
    y3 = ops.gemv(x, w, torch.float32, no_split)
    check_close(y3, reference.qmm(x32, planes, out_dtype=None), "qmm", "float32", "no split")


def test_strided_rows_and_out_dtype(cfg: KernelConfig) -> None:
    """x rows with a stride wider than K (a column slice) and an output dtype other than
    x's."""
    rng = np.random.default_rng(9)
    planes = _weight(rng, 9, 64)
    wide = torch.from_numpy(rng.standard_normal((5, 80)).astype(np.float32))
    x = wide[:, 8:72]
    assert x.stride(0) == 80
    ref = reference.qmm(x.numpy(), planes, out_dtype=None)
    for path in ("gemv", "gemm"):
        y = ops.qmm(x, upload(planes, "cpu"), torch.bfloat16, cfg, path)
        assert y.dtype == torch.bfloat16
        check_close(y, ref, "qmm", "bfloat16", path)


def test_zero_rows_and_non_finite_x(cfg: KernelConfig) -> None:
    rng = np.random.default_rng(1)
    w = upload(_weight(rng, 8, 32), "cpu")
    assert ops.gemm(torch.zeros((0, 32)), w, torch.float32, cfg).shape == (0, 8)
    x = torch.ones((2, 32))
    x[1, 3] = float("nan")
    y = to_numpy(ops.gemv(x, w, torch.float32, cfg))
    assert np.isfinite(y[0]).all()
    assert np.isnan(y[1]).all()


def test_unknown_path_is_refused(cfg: KernelConfig) -> None:
    w = upload(_weight(np.random.default_rng(2), 8, 32), "cpu")
    with pytest.raises(ValueError, match="unknown qmm path"):
        ops.qmm(torch.ones((2, 32)), w, torch.float32, cfg, "w4a4")
