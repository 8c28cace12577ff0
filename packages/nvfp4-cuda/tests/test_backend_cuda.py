"""The cuda backend end to end under the interpreter: the dispatch table picks the kernels,
the overrides reach every path, and each agrees with the reference."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from nvfp4 import get_backend, reference
from nvfp4.testing import assert_within, module_from_file
from nvfp4.tolerances import tolerance
from nvfp4_cuda import backend, dispatch
from nvfp4_triton.testing import check_close, torch_activations

ROOT = Path(__file__).resolve().parents[3]


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
    check_close(y, reference.qmm(x, planes, out_dtype=None), "qmm", "float32", f"{path!r} M={m}")


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
    assert_within(y[ok], ref[ok], tolerance("gather_qmm", "float32"), f"gather {path!r}")


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


def _load_benchmark() -> Any:
    return module_from_file(ROOT / "benchmarks" / "cuda_kernels.py", "cuda_kernels_bench")


def _dry_run_benchmark(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The benchmark module set up to run on the CPU under the interpreter: tiny shapes, and a
    stand-in timer (one call, wall time), since nothing here measures a GPU."""
    bench = _load_benchmark()
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 16)
    monkeypatch.setattr(bench, "SELF_CHECK", (40, 128, (1, 17)))
    monkeypatch.setattr(bench, "DECODE_SHAPES", [(40, 128), (24, 256)])
    monkeypatch.setattr(bench, "DECODE_M", [1, 3])
    monkeypatch.setattr(bench, "PREFILL_M", [20, 33])
    monkeypatch.setattr(bench, "MOE_CASES", [(3, 24, 128)])
    monkeypatch.setattr(bench, "MOE_M", [2, 9])

    def one_call_ms(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return max(time.perf_counter() - t0, 1e-9) * 1e3

    monkeypatch.setattr(bench, "_bench", one_call_ms)
    return bench


def test_benchmark_dry_run_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything of benchmarks/cuda_kernels.py but the timing, so a lent GPU's minutes are
    not lost to a bug in the script: every section's rows, the dispatch column, the JSON
    and the summary."""
    bench = _dry_run_benchmark(monkeypatch)
    r = bench.run(quick=False)
    json.dumps(r)  # the result is JSON as written
    assert r["machine"]["device"] == "Triton interpreter on CPU"
    assert [(d["N"], d["K"], d["M"]) for d in r["decode"]] == [
        (40, 128, 1),
        (40, 128, 3),
        (24, 256, 1),
        (24, 256, 3),
    ]
    for d in r["decode"]:
        assert set(d) >= {"gemv", "gemm", "dequant_matmul", "dispatch", "bytes"}
        assert d["dispatch"] in ("gemv", "gemm", "dequant_matmul")
        assert d["gemv"]["fraction_of_copy"] > 0
    assert [(d["N"], d["M"]) for d in r["prefill"]] == [(40, 20), (40, 33), (24, 20), (24, 33)]
    assert all("w4a4" not in d for d in r["prefill"])  # not declared under the interpreter
    assert [(d["E"], d["M"]) for d in r["moe"]] == [(3, 2), (3, 9)]
    for d in r["moe"]:
        assert 1 <= d["experts_touched"] <= 3
        assert {"rows_unsorted", "rows_sorted", "grouped_unsorted", "grouped_sorted"} <= set(d)
    text = bench.summary(r)
    for heading in ("## Decode", "## Prefill", "## MoE gather"):
        assert heading in text
    assert text.count("\n| 40 x 128 |") == 4  # two decode rows, two prefill rows


def test_benchmark_refuses_to_time_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The self-check runs before any timing: a path that disagrees with the reference stops
    the run with its name."""
    bench = _dry_run_benchmark(monkeypatch)
    from nvfp4_triton import ops

    real = ops.qmm

    def broken(x: Any, w: Any, dtype: Any, cfg: Any, path: Any) -> Any:
        y = real(x, w, dtype, cfg, path)
        return y * 1.01 if path == "gemm" else y

    monkeypatch.setattr(ops, "qmm", broken)
    with pytest.raises(SystemExit, match="qmm gemm M=1"):
        bench.run(quick=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_w4a8_verbs(dtype: str) -> None:
    """W4A8 int8 and FP8 (dynamic and static scales) and the MoE form through the cuda
    backend under the interpreter (its own, large tiles), against the reference."""
    b = backend()
    rng = np.random.default_rng(21)
    planes = reference.quantize(
        rng.standard_normal((40, 96)).astype(np.float32), partitions=(0, 8, 40)
    )
    xt, x = torch_activations(rng, 5, 96, dtype)
    w = b.prepare(planes)
    check_close(
        b.qmm_w4a8(xt, w), reference.qmm_w4a8(x, planes, out_dtype=None), "w4a8", dtype, "qmm_w4a8"
    )
    for scale in (None, 0.02):
        y = b.qmm_w4a8_fp8(xt, w, input_scale=scale)
        ref = reference.qmm_w4a8_fp8(x, planes, input_scale=scale, out_dtype=None)
        check_close(y, ref, "w4a8_fp8", dtype, f"qmm_w4a8_fp8 scale={scale}")
    experts = reference.quantize(rng.standard_normal((3, 24, 64)).astype(np.float32))
    ids = np.array([2, 0, 3, 0, -1, 1])
    xe = rng.standard_normal((6, 64)).astype(np.float32)
    ye = b.to_numpy(b.gather_qmm_w4a8(xe, b.prepare(experts), ids))
    assert (ye[[2, 4]] == 0).all()
    ref = reference.gather_qmm_w4a8(xe, experts, ids, out_dtype=None)
    assert_within(ye, ref, tolerance("w4a8", "float32"), "gather_qmm_w4a8")


def test_w4a8_fp8_refused_on_a_gpu_without_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute capability 8.0 (int8 tensor cores, no FP8): w4a8 declared, w4a8_fp8 not,
    and the FP8 kernel refuses a direct call rather than emulate."""
    from nvfp4_triton.testing import fake_gpu

    fake_gpu(monkeypatch, hip=None, multi_processor_count=108)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100")
    b = backend()
    assert "w4a8" in b.info.capabilities
    assert "w4a8_fp8" not in b.info.capabilities
    with pytest.raises(NotImplementedError, match="FP8 tensor cores"):
        b.kernels.qmm_w4a8_fp8(torch.ones(2, 32), None, input_scale=None, out_dtype="float32")
