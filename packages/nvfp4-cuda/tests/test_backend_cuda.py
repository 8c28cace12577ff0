"""The cuda backend end to end under the interpreter: the dispatch table picks the kernels,
the overrides reach every path, and each agrees with the reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nvfp4 import get_backend, reference
from nvfp4.tolerances import tolerance
from nvfp4_cuda import backend, dispatch

ROOT = Path(__file__).resolve().parents[3]


def _err(y: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.abs(y.float().numpy() - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("path", ["", "gemv", "gemm", "dequant_matmul"])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_qmm_every_path(monkeypatch: pytest.MonkeyPatch, path: str, m: int) -> None:
    monkeypatch.setenv(dispatch.PATH_ENV, path)
    b = get_backend("cuda")
    rng = np.random.default_rng(m)
    planes = reference.quantize(
        rng.standard_normal((40, 96)).astype(np.float32), partitions=(0, 8, 40)
    )
    x = rng.standard_normal((m, 96)).astype(np.float32)
    y = b.qmm(b.from_numpy(x), b.prepare(planes))
    assert y.dtype == torch.float32
    assert tuple(y.shape) == (m, 40)
    assert _err(y, reference.qmm(x, planes, out_dtype=None)) <= tolerance("qmm", "float32")


@pytest.mark.parametrize("path", ["", "rows", "grouped"])
def test_gather_every_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setenv(dispatch.GATHER_PATH_ENV, path)
    b = backend()
    rng = np.random.default_rng(4)
    planes = reference.quantize(rng.standard_normal((3, 24, 64)).astype(np.float32))
    x = rng.standard_normal((6, 64)).astype(np.float32)
    ids = np.array([2, 0, 3, 0, -1, 1])
    y = b.to_numpy(b.gather_qmm(b.from_numpy(x), b.prepare(planes), b.from_numpy(ids)))
    ok = (ids >= 0) & (ids < 3)
    assert (y[~ok] == 0).all()
    ref = reference.gather_qmm(x, planes, ids, out_dtype=None)
    assert float(np.abs(y[ok] - ref[ok]).max() / np.abs(ref).max()) <= tolerance(
        "gather_qmm", "float32"
    )


def test_w4a4_absent_under_the_interpreter() -> None:
    b = backend()
    w = b.prepare(reference.quantize(np.ones((4, 32), np.float32)))
    with pytest.raises(NotImplementedError, match="w4a4"):
        b.qmm_w4a4(torch.ones(2, 32), w)


def test_benchmark_refuses_without_gpu() -> None:
    script = ROOT / "benchmarks" / "cuda_kernels.py"
    assert script.exists(), script
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cannot run here" in out.stderr
    assert "TRITON_INTERPRET" in out.stderr
    env_free = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "0"},
    )
    assert env_free.returncode == 2, env_free.stderr
    assert "no CUDA GPU" in env_free.stderr, env_free.stderr
