"""GPU benchmark of the nvfp4-cuda kernels, every figure next to a baseline measured in the
same run (a ratio, because absolute times drift between machines and runs).

* **Decode (W4A16 GEMV)**, M = 1, 4, 16 on ``[N, K]`` = 4096 x 14336 and 14336 x 4096
  weights: achieved bandwidth (packed codes + scales + x + y, per call) as a fraction of a
  device-to-device copy's bandwidth measured here; every ``qmm`` path is timed
  (``gemv``, ``gemm``, ``dequant_matmul``) so the dispatch crossovers can be read off.
* **Prefill**, M = 256 ... 4096 on the same weights: TFLOP/s of the in-loop-dequantizing
  GEMM and of dequantize + ``torch.matmul``, against bfloat16 ``torch.matmul`` on the dense
  equivalent weight; on compute capability 10.x / 12.x also W4A4 (``qmm_w4a4``).
* **MoE gather**, 8 experts of 14336 x 4096 and 64 experts of 1408 x 2048, with M = 8 and
  M = 512 routed rows: time and bandwidth of the unique experts' bytes against the copy.

It needs an NVIDIA GPU and refuses anything else cleanly (exit status 2, with the reason):
no GPU, a ROCm build, or ``TRITON_INTERPRET=1`` (the interpreter measures nothing about
speed). Output: ``benchmarks/results/cuda_kernels.json`` (machine, versions, every figure)
and a Markdown summary in ``docs/benchmark_results/cuda_kernels.md``.

Timing: ``triton.testing.do_bench_cudagraph`` (CUDA graphs hide the launch floor, which
small shapes need) where it works, else ``do_bench``; both report
the median. Before timing, every path is checked against the float64 reference on a small
shape, so a wrong kernel cannot produce a fast figure.

Usage::

    python benchmarks/cuda_kernels.py [--quick] [--out PATH] [--summary PATH]

A GPU may be lent for minutes only, so the script must work the first time it meets one:
``packages/nvfp4-cuda/tests`` runs :func:`run` and :func:`summary` end to end under the
interpreter on the CPU (``DEVICE = "cpu"``, tiny shapes, a stand-in timer; nothing of that
run is a measurement and nothing is written under ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cuda_kernels.json"
DEFAULT_SUMMARY = ROOT / "docs" / "benchmark_results" / "cuda_kernels.md"
DECODE_SHAPES = [(4096, 14336), (14336, 4096)]  # [N, K]
DECODE_M = [1, 4, 16]
PREFILL_M = [256, 1024, 2048, 4096]
MOE_CASES = [(8, 14336, 4096), (64, 1408, 2048)]  # (E, N, K)
MOE_M = [8, 512]
SELF_CHECK = (200, 512, (1, 16, 300))  # N, K, the values of M of the correctness check
COPY_BYTES = 1 << 30  # the copy baseline: 1 GiB, far beyond any cache
DEVICE = "cuda"  # the torch device of every tensor (the dry-run test sets "cpu")


def refuse_reason() -> str:
    """Why this machine cannot run the benchmark ('' when it can)."""
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on"):
        return "TRITON_INTERPRET is set: the interpreter measures nothing about GPU speed; unset it"
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        return f"torch and triton are required: {exc}"
    if getattr(torch.version, "hip", None):
        return "this torch is a ROCm build: this benchmark is for NVIDIA GPUs"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    return ""


def _bench(fn: Any) -> float:
    """Median milliseconds of ``fn()``."""
    import torch
    import triton.testing as tt

    fn()
    torch.cuda.synchronize()
    try:
        return float(tt.do_bench_cudagraph(fn, rep=50))
    except Exception:
        return float(tt.do_bench(fn, warmup=10, rep=50))


def _random_planes(rng: np.random.Generator, lead: tuple[int, ...], k: int) -> Any:
    from nvfp4.planes import NVFP4Planes

    codes = rng.integers(0, 256, (*lead, k // 2), dtype=np.uint8)
    scales = rng.integers(0x20, 0x40, (*lead, k // 16), dtype=np.uint8)
    g = np.full(lead[:1] if len(lead) == 2 else (), 0.01, dtype=np.float32)
    return NVFP4Planes(codes, scales, g, name="bench")


def _copy_bandwidth(torch: Any) -> float:
    """Bytes/s of a device-to-device copy of COPY_BYTES (read + write)."""
    n = COPY_BYTES
    src = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    return 2 * n / (ms * 1e-3)


def _self_check(b: Any, torch: Any) -> list[str]:
    """Every path against the float64 reference on a small shape; returns the failures."""
    from nvfp4 import reference
    from nvfp4.testing import relative_error
    from nvfp4.tolerances import tolerance
    from nvfp4_triton import ops

    p = b.platform()
    rng = np.random.default_rng(0)
    n, k, ms = SELF_CHECK
    planes = reference.quantize(rng.standard_normal((n, k)).astype(np.float32))
    w = b.prepare(planes)
    bad = []
    for m in ms:
        x = rng.standard_normal((m, k)).astype(np.float32)
        xt = torch.from_numpy(x).to(DEVICE).to(torch.bfloat16)
        ref = reference.qmm(xt.float().cpu().numpy(), planes, out_dtype=None)
        for path in ops.QMM_PATHS:
            y = ops.qmm(xt, w.payload, torch.bfloat16, p.config, path).float().cpu().numpy()
            err = relative_error(y, ref)
            if not err <= tolerance("qmm", "bfloat16"):
                bad.append(f"qmm {path} M={m}: error {err:.3g}")
    return bad


def run(quick: bool) -> dict[str, Any]:
    import torch
    import triton
    from nvfp4_cuda import backend
    from nvfp4_triton import ops

    b = backend()
    avail = b.availability()
    if not avail.ok:
        raise SystemExit(f"cuda backend unavailable: {avail.reason}")
    p = b.platform()
    cfg = p.config
    failures = _self_check(b, torch)
    if failures:
        raise SystemExit(
            "kernels disagree with the reference; not timing:\n  " + "\n  ".join(failures)
        )
    rng = np.random.default_rng(1)
    copy_bw = _copy_bandwidth(torch)
    result: dict[str, Any] = {
        "machine": {
            "device": avail.device,
            "capability": list(p.capability or ()),
            "multiprocessors": p.multiprocessors,
            "host": platform.node(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "config": cfg.describe(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "decode": [],
        "prefill": [],
        "moe": [],
    }
    decode_m = DECODE_M[:1] if quick else DECODE_M
    for n, k in DECODE_SHAPES[:1] if quick else DECODE_SHAPES:
        w = b.prepare(_random_planes(rng, (n,), k))
        for m in decode_m:
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            moved = n * k // 2 + n * k // 16 + 2 * m * (k + n)
            row: dict[str, Any] = {"N": n, "K": k, "M": m, "bytes": moved}
            for path in ops.QMM_PATHS:
                ms = _bench(
                    lambda p_=path, x=x, w=w: ops.qmm(x, w.payload, torch.bfloat16, cfg, p_)
                )
                row[path] = {
                    "ms": ms,
                    "GBps": moved / (ms * 1e-3) / 1e9,
                    "fraction_of_copy": moved / (ms * 1e-3) / copy_bw,
                }
            row["dispatch"] = b.qmm_path(m, n, k, torch.bfloat16, p)
            result["decode"].append(row)
    for n, k in DECODE_SHAPES[:1] if quick else DECODE_SHAPES:
        planes = _random_planes(rng, (n,), k)
        w = b.prepare(planes)
        dense = b.dequantize(w, "bfloat16")
        for m in PREFILL_M[:2] if quick else PREFILL_M:
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            flops = 2.0 * m * n * k
            base_ms = _bench(lambda x=x, dense=dense: x @ dense.t())
            row = {"N": n, "K": k, "M": m, "torch_bf16_TFLOPs": flops / (base_ms * 1e-3) / 1e12}
            for path in ("gemm", "dequant_matmul"):
                ms = _bench(
                    lambda p_=path, x=x, w=w: ops.qmm(x, w.payload, torch.bfloat16, cfg, p_)
                )
                row[path] = {
                    "ms": ms,
                    "TFLOPs": flops / (ms * 1e-3) / 1e12,
                    "vs_torch_bf16": base_ms / ms,
                }
            if "w4a4" in b.info.capabilities:
                ms = _bench(lambda x=x, w=w: b.qmm_w4a4(x, w))
                row["w4a4"] = {
                    "ms": ms,
                    "TFLOPs": flops / (ms * 1e-3) / 1e12,
                    "vs_torch_bf16": base_ms / ms,
                }
            row["dispatch"] = b.qmm_path(m, n, k, torch.bfloat16, p)
            result["prefill"].append(row)
    for e, n, k in MOE_CASES[:1] if quick else MOE_CASES:
        w = b.prepare(_random_planes(rng, (e, n), k))
        for m in MOE_M:
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            ids = torch.randint(0, e, (m,), device=DEVICE)
            touched = int(torch.unique(ids).numel())
            moved = touched * (n * k // 2 + n * k // 16) + 2 * m * (k + n)
            row = {"E": e, "N": n, "K": k, "M": m, "experts_touched": touched}
            for path in ops.GATHER_PATHS:
                for srt in (False, True):
                    idx = torch.sort(ids).values if srt else ids
                    ms = _bench(
                        lambda path=path, idx=idx, srt=srt, x=x, w=w: ops.gather(
                            x, w.payload, idx, torch.bfloat16, cfg, path=path, sorted_indices=srt
                        )
                    )
                    row[f"{path}_{'sorted' if srt else 'unsorted'}"] = {
                        "ms": ms,
                        "GBps": moved / (ms * 1e-3) / 1e9,
                        "fraction_of_copy": moved / (ms * 1e-3) / copy_bw,
                    }
            result["moe"].append(row)
    return result


def summary(r: dict[str, Any]) -> str:
    """The Markdown summary of one run."""
    mach = r["machine"]
    lines = [
        "# nvfp4-cuda kernels",
        "",
        f"{mach['device']}; torch {mach['torch']} (CUDA {mach['cuda']}), triton "
        f"{mach['triton']}; {mach['date']}. Copy bandwidth measured in the same run: "
        f"{r['copy_bandwidth_GBps']:.0f} GB/s. Tiles: {mach['config']}.",
        "",
        "## Decode (W4A16), fraction of copy bandwidth",
        "",
        "| N x K | M | gemv | gemm | dequant_matmul | dispatch picks |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for d in r["decode"]:
        lines.append(
            f"| {d['N']} x {d['K']} | {d['M']} | {d['gemv']['fraction_of_copy']:.2f} | "
            f"{d['gemm']['fraction_of_copy']:.2f} | {d['dequant_matmul']['fraction_of_copy']:.2f} "
            f"| {d['dispatch']} |"
        )
    lines += [
        "",
        "## Prefill, throughput relative to bfloat16 torch.matmul",
        "",
        "| N x K | M | torch bf16 TFLOP/s | gemm | dequant_matmul | w4a4 | dispatch picks |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for d in r["prefill"]:
        w4 = f"{d['w4a4']['vs_torch_bf16']:.2f}" if "w4a4" in d else "n/a"
        lines.append(
            f"| {d['N']} x {d['K']} | {d['M']} | {d['torch_bf16_TFLOPs']:.0f} | "
            f"{d['gemm']['vs_torch_bf16']:.2f} | {d['dequant_matmul']['vs_torch_bf16']:.2f} | "
            f"{w4} | {d['dispatch']} |"
        )
    lines += [
        "",
        "## MoE gather, fraction of copy bandwidth (unique experts' bytes)",
        "",
        "| E | N x K | M | rows unsorted | rows sorted | grouped unsorted | grouped sorted |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for d in r["moe"]:
        cells = [
            f"{d[k]['fraction_of_copy']:.2f}"
            for k in ("rows_unsorted", "rows_sorted", "grouped_unsorted", "grouped_sorted")
        ]
        lines.append(f"| {d['E']} | {d['N']} x {d['K']} | {d['M']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape per section")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--summary", type=Path, default=DEFAULT_SUMMARY)
    args = ap.parse_args(argv)
    reason = refuse_reason()
    if reason:
        print(f"cuda_kernels.py: cannot run here: {reason}", file=sys.stderr)
        return 2
    r = run(args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(r, indent=2) + "\n")
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(summary(r))
    print(summary(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
