"""`nvfp4 convert` against a plain copy of the same files, in one run.

A synthetic ModelOpt NVFP4 checkpoint of more than 1 GB is built (or reused from
``--workdir``) with :func:`nvfp4_checkpoints.write_checkpoint`: Llama-like names and shapes
(q/k/v/o, gate/up/down NVFP4 with weight and input scales; embeddings, lm_head and norms
bf16), several shards and a ``model.safetensors.index.json``. The planes are random valid
bytes (codes: any byte; scales: E4M3 bytes 0x00..0x7E) drawn directly, not quantized from
dense matrices: each tensor is a view at its own offset into a pool of random bytes, so
building costs only the write.

Arms, each run as a fresh child process (``python -m nvfp4_checkpoints.cli convert SRC DST --to T``, or
for ``copy`` a child that ``shutil.copyfile``-s every file of SRC then fsyncs it, as the
converters fsync their outputs):

* ``copy`` - the baseline: same input files, same file system, same page-cache state;
* ``mlx``, ``gguf``, ``modelopt``, ``compressed-tensors`` - the four convert targets; the
  Hugging Face ones get ``--max-shard-bytes`` of the source, so they write and fsync as many
  files as the copy (as with real 5 GB shards and the default).

Before every round the parent reads all source files once (warm-up, timed and reported), so
every arm reads from a warm page cache; nothing is dropped, ``sync`` runs before each arm and
each output is deleted after it (untimed). Arms rotate their order every round. Each figure
is the median of ``--runs`` rounds (3).

* throughput = source bytes / child wall time (interpreter start-up and imports included;
  the CLI's own in-process time and the bare start-up cost are reported alongside);
* peak memory = the child's peak resident set (``ru_maxrss`` reported by GNU
  ``/usr/bin/time -f %M``; touched file-backed memory-mapped pages count), judged on the
  worst run.

Bars: throughput >= 1/3 of the copy's; peak RSS < 2 x the largest tensor of the
source + 300 MB (MB = 10^6 bytes).

Writes ``benchmarks/results/convert.json``, ``docs/benchmark_results/convert.md`` and
``docs/benchmark_results/convert.png``. ``--quick`` builds a tiny checkpoint, runs once and
only prints (a smoke test, not a measurement). Large files are deleted at the end unless
``--keep`` (keep them, with ``--workdir``, to reuse the source next time).

    python benchmarks/convert.py [--workdir DIR] [--keep] [--runs 3] [--layers 6] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
CORE_SRC = REPO / "packages" / "nvfp4-core" / "src"
CHECKPOINTS_SRC = REPO / "packages" / "nvfp4-checkpoints" / "src"
#: The checkout's sources of the packages that are not installed (children get them too).
SOURCES = [
    str(src)
    for name, src in (("nvfp4", CORE_SRC), ("nvfp4_checkpoints", CHECKPOINTS_SRC))
    if importlib.util.find_spec(name) is None
]
sys.path[:0] = SOURCES

import ml_dtypes  # noqa: E402
import nvfp4  # noqa: E402
from machine import cpu_model, dist_version, ram_bytes  # noqa: E402
from nvfp4.planes import NVFP4Planes  # noqa: E402
from nvfp4.spec import BLOCK_SIZE  # noqa: E402
from nvfp4_checkpoints import write_checkpoint  # noqa: E402
from nvfp4_checkpoints.safetensors_io import read_header  # noqa: E402
from plotting import pyplot  # noqa: E402

TARGETS = ("mlx", "gguf", "modelopt", "compressed-tensors")
ARMS = ("copy", *TARGETS)
#: Bump when the generated checkpoint changes, so a cached source is rebuilt.
GENERATOR_VERSION = 1
MB = 1_000_000
THROUGHPUT_BAR = 1 / 3  # of the copy's throughput
MEMORY_SLACK = 300 * MB  # peak RSS < 2 x largest tensor + this

GNU_TIME = "/usr/bin/time"
RESULTS_JSON = REPO / "benchmarks" / "results" / "convert.json"
DOCS_MD = REPO / "docs" / "benchmark_results" / "convert.md"
DOCS_PNG = REPO / "docs" / "benchmark_results" / "convert.png"

#: The baseline child: copy every file of SRC into DST, fsync each file and DST.
COPY_CHILD = """
import os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
os.mkdir(dst)
for name in sorted(os.listdir(src)):
    s = os.path.join(src, name)
    if os.path.isfile(s):
        d = os.path.join(dst, name)
        shutil.copyfile(s, d)
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
fd = os.open(dst, os.O_RDONLY)
os.fsync(fd)
os.close(fd)
"""


# ========================================================================== checkpoint
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Shapes of the synthetic Llama-like checkpoint."""

    layers: int = 6
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 32000
    shard_bytes: int = 300 * MB
    #: Phi-3's layout: q/k/v fused as ``self_attn.qkv_proj``, gate/up as ``mlp.gate_up_proj``
    #: (one NVFP4 tensor each, one global, as ModelOpt writes fused layers).
    fused: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` (ModelOpt's quantization block is added by the
        writer)."""
        return {
            "architectures": ["Phi3ForCausalLM" if self.fused else "LlamaForCausalLM"],
            "model_type": "phi3" if self.fused else "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "_name_or_path": f"nvfp4-benchmark-synthetic-{'phi3' if self.fused else 'llama'}",
        }

    def plane_shapes(self) -> dict[str, tuple[int, int]]:
        """NVFP4 prefix -> logical (N, K)."""
        h, f, kv = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        shapes: dict[str, tuple[int, int]] = {}
        for i in range(self.layers):
            p = f"model.layers.{i}"
            if self.fused:
                shapes[f"{p}.self_attn.qkv_proj"] = (h + 2 * kv, h)
            else:
                shapes[f"{p}.self_attn.q_proj"] = (h, h)
                shapes[f"{p}.self_attn.k_proj"] = (kv, h)
                shapes[f"{p}.self_attn.v_proj"] = (kv, h)
            shapes[f"{p}.self_attn.o_proj"] = (h, h)
            if self.fused:
                shapes[f"{p}.mlp.gate_up_proj"] = (2 * f, h)
            else:
                shapes[f"{p}.mlp.gate_proj"] = (f, h)
                shapes[f"{p}.mlp.up_proj"] = (f, h)
            shapes[f"{p}.mlp.down_proj"] = (h, f)
        return shapes

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """bf16 tensor name -> shape."""
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab, self.hidden)
        }
        for i in range(self.layers):
            shapes[f"model.layers.{i}.input_layernorm.weight"] = (self.hidden,)
            shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = (self.hidden,)
        shapes["model.norm.weight"] = (self.hidden,)
        shapes["lm_head.weight"] = (self.vocab, self.hidden)
        return shapes


QUICK_SPEC = ModelSpec(
    layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=1024, shard_bytes=400_000
)


class RandomPlanes(Mapping[str, NVFP4Planes]):
    """``prefix -> NVFP4Planes`` made on access: views at per-tensor offsets into two pools
    of random bytes (codes: any byte; scales: valid E4M3 bytes 0x00..0x7E), a per-tensor
    global. Holds only the pools, whatever the checkpoint's size."""

    def __init__(self, shapes: Mapping[str, tuple[int, int]], seed: int = 0) -> None:
        self.shapes = dict(shapes)
        self.index = {name: i for i, name in enumerate(self.shapes)}
        rng = np.random.default_rng(seed)
        max_codes = max(n * k // 2 for n, k in self.shapes.values())
        max_scales = max(n * k // BLOCK_SIZE for n, k in self.shapes.values())
        self.codes_pool = np.frombuffer(rng.bytes(max_codes + (16 << 20)), dtype=np.uint8)
        raw = np.frombuffer(rng.bytes(max_scales + (4 << 20)), dtype=np.uint8)
        self.scales_pool = raw % np.uint8(0x7F)

    @staticmethod
    def _view(pool: npt.NDArray[np.uint8], i: int, shape: tuple[int, int]) -> npt.NDArray[np.uint8]:
        size = shape[0] * shape[1]
        offset = (i * 1_000_003) % (pool.size - size + 1)
        return pool[offset : offset + size].reshape(shape)

    def __getitem__(self, key: str) -> NVFP4Planes:
        n, k = self.shapes[key]
        i = self.index[key]
        return NVFP4Planes(
            codes=self._view(self.codes_pool, i, (n, k // 2)),
            scales=self._view(self.scales_pool, i, (n, k // BLOCK_SIZE)),
            global_scale=np.float32(2e-4 * (1 + (i % 7) / 7)),
            name=key,
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def random_bf16(shape: tuple[int, ...], rng: np.random.Generator) -> npt.NDArray[Any]:
    """Random bf16 values of magnitude [2^-7, 2^-6) with random signs (bit patterns drawn
    directly: sign | exponent 120 | random mantissa)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    bits &= np.uint16(0x807F)
    bits |= np.uint16(0x3C00)
    return bits.view(ml_dtypes.bfloat16)


def build_source(src: Path, spec: ModelSpec) -> float:
    """Write the synthetic ModelOpt checkpoint at ``src``; returns the seconds it took."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    planes = RandomPlanes(spec.plane_shapes())
    tensors: dict[str, npt.NDArray[Any]] = {}
    for name, shape in spec.tensor_shapes().items():
        if len(shape) == 1:
            tensors[name] = np.ones(shape, dtype=ml_dtypes.bfloat16)
        else:
            tensors[name] = random_bf16(shape, rng)
    input_scales = {p: 0.02 + 0.001 * (i % 5) for i, p in enumerate(planes)}
    write_checkpoint(
        src,
        planes,
        flavour="modelopt",
        tensors=tensors,
        config=spec.config(),
        input_scales=input_scales,
        max_shard_bytes=spec.shard_bytes,
    )
    (src / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n"
    )
    return time.perf_counter() - t0


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.is_file())


def prepare_source(workdir: Path, spec: ModelSpec) -> dict[str, Any]:
    """Reuse ``workdir/src`` when its stamp matches ``spec``, else (re)build it."""
    src = workdir / "src"
    stamp_path = workdir / "src.stamp.json"
    stamp = {"generator": GENERATOR_VERSION, "spec": dataclasses.asdict(spec)}
    if src.is_dir() and stamp_path.is_file():
        old = json.loads(stamp_path.read_text())
        sizes = {p.name: p.stat().st_size for p in source_files(src)}
        if {k: old.get(k) for k in stamp} == stamp and old.get("files") == sizes:
            return {"reused": True, "build_s": None}
    if src.exists():
        shutil.rmtree(src)
    stamp_path.unlink(missing_ok=True)
    build_s = build_source(src, spec)
    stamp["files"] = {p.name: p.stat().st_size for p in source_files(src)}
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    return {"reused": False, "build_s": round(build_s, 2)}


def describe_source(src: Path) -> dict[str, Any]:
    """Files, bytes, tensor counts and the largest tensors (from the safetensors headers)."""
    files = source_files(src)
    infos: dict[str, int] = {}
    for f in files:
        if f.suffix == ".safetensors":
            header, _ = read_header(f)
            infos.update({name: info.nbytes for name, info in header.items()})
    largest = max(infos, key=lambda n: infos[n])
    nvfp4_weights = {
        n[: -len(".weight")]: infos[n] + infos[n + "_scale"]
        for n in infos
        if n.endswith(".weight") and n + "_scale" in infos
    }
    largest_q = max(nvfp4_weights, key=lambda n: nvfp4_weights[n])
    return {
        "files": len(files),
        "shards": sum(f.suffix == ".safetensors" for f in files),
        "index_json": (src / "model.safetensors.index.json").is_file(),
        "input_bytes": sum(f.stat().st_size for f in files),
        "tensors": len(infos),
        "nvfp4_weights": len(nvfp4_weights),
        "largest_tensor": {"name": largest, "bytes": infos[largest]},
        "largest_nvfp4_weight": {
            "name": largest_q,
            "bytes": nvfp4_weights[largest_q],
            "what": "codes + block scales",
        },
    }


# ============================================================================ running
def warm_read(src: Path) -> float:
    """Read every source file once (page-cache warm-up); returns GB/s."""
    buf = bytearray(16 << 20)
    total = 0
    t0 = time.perf_counter()
    for f in source_files(src):
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total / (time.perf_counter() - t0) / 1e9


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    if SOURCES:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*SOURCES, env.get("PYTHONPATH")]))
    return env


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """What one child process cost."""

    wall_s: float
    peak_rss_bytes: int
    cpu_s: float  # user + system
    status: int


def run_child(cmd: list[str], log: Path) -> ChildRun:
    """Run ``cmd`` under GNU time (stdout and stderr to ``log``). GNU time forks the
    command, so the ``ru_maxrss`` it reports is the command's own (a child forked or vforked
    straight from this process would inherit this process's high-water mark across
    ``exec``)."""
    if not os.access(GNU_TIME, os.X_OK):
        raise SystemExit(f"needs GNU time at {GNU_TIME} (Debian/Ubuntu: apt-get install time)")
    usage_file = log.with_suffix(".usage")
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        rc = subprocess.call(
            [GNU_TIME, "-f", "%M %U %S", "-o", str(usage_file), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        wall = time.perf_counter() - t0
    kib, user, system = usage_file.read_text().strip().splitlines()[-1].split()
    return ChildRun(wall, int(kib) * 1024, float(user) + float(system), rc)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def output_path(arm: str, workdir: Path) -> Path:
    return workdir / ("out.gguf" if arm == "gguf" else f"out_{arm}")


def arm_cmd(arm: str, src: Path, dst: Path, shard_bytes: int) -> list[str]:
    """The child command of ``arm``. Hugging Face targets shard like the source (as they
    would with real 5 GB shards), so copy and convert write and fsync as many files."""
    if arm == "copy":
        return [sys.executable, "-c", COPY_CHILD, str(src), str(dst)]
    cmd = [
        sys.executable,
        "-m",
        "nvfp4_checkpoints.cli",
        "convert",
        str(src),
        str(dst),
        "--to",
        arm,
    ]
    return cmd if arm == "gguf" else [*cmd, "--max-shard-bytes", str(shard_bytes)]


def run_arm(arm: str, src: Path, workdir: Path, shard_bytes: int) -> dict[str, Any]:
    """One timed run of ``arm``; the output is measured then deleted (untimed)."""
    dst = output_path(arm, workdir)
    remove(dst)
    log = workdir / f"{arm}.log"
    os.sync()
    run = run_child(arm_cmd(arm, src, dst, shard_bytes), log)
    text = log.read_text(errors="replace")
    if run.status != 0:
        raise SystemExit(f"{arm}: exit {run.status}\n{text[-3000:]}")
    found = re.search(r"^wrote .*?([\d.]+) s\)\s*$", text, re.MULTILINE)
    out = {
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "peak_rss_bytes": run.peak_rss_bytes,
        "in_process_s": float(found.group(1)) if found else None,
        "output_files": 1 if dst.is_file() else sum(p.is_file() for p in dst.iterdir()),
        "output_bytes": tree_bytes(dst),
    }
    remove(dst)
    return out


def startup_cost(workdir: Path) -> float:
    """Median seconds of ``python -m nvfp4_checkpoints.cli --help`` (interpreter + imports)."""
    cmd = [sys.executable, "-m", "nvfp4_checkpoints.cli", "--help"]
    return statistics.median(run_child(cmd, workdir / "startup.log").wall_s for _ in range(3))


def verify_outputs(src: Path, workdir: Path, shard_bytes: int) -> dict[str, str]:
    """Convert once more to each target and ``nvfp4 verify`` it against the source
    (untimed): the timed commands produce correct checkpoints."""
    verdicts: dict[str, str] = {}
    for arm in TARGETS:
        dst = output_path(arm, workdir)
        remove(dst)
        log = workdir / f"verify_{arm}.log"
        status = run_child(arm_cmd(arm, src, dst, shard_bytes), log).status
        if status == 0:
            cmd = [sys.executable, "-m", "nvfp4_checkpoints.cli", "verify", str(src), str(dst)]
            status = run_child(cmd, log).status
        lines = log.read_text(errors="replace").strip().splitlines()
        verdicts[arm] = (lines[-1] if lines else "") if status == 0 else f"FAILED: {lines[-1:]}"
        remove(dst)
    return verdicts


# ============================================================================ machine
def machine_info() -> dict[str, Any]:
    cpu = cpu_model()
    versions: dict[str, str | None] = {
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "nvfp4": nvfp4.__version__,
    }
    versions["gguf"] = dist_version("gguf")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": ram_bytes(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ============================================================================ summary
def summarize(runs: dict[str, list[dict[str, Any]]], input_bytes: int) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        rss = [r["peak_rss_bytes"] for r in rs]
        inproc = [r["in_process_s"] for r in rs if r["in_process_s"] is not None]
        cpu = [r["cpu_s"] for r in rs]
        med = statistics.median(walls)
        arms[arm] = {
            "wall_s": [round(w, 3) for w in walls],
            "median_wall_s": round(med, 3),
            "throughput_MBps": round(input_bytes / med / MB, 1),
            "in_process_s": [round(x, 3) for x in inproc] or None,
            "median_in_process_s": round(statistics.median(inproc), 3) if inproc else None,
            "cpu_s": [round(x, 2) for x in cpu],
            "median_cpu_s": round(statistics.median(cpu), 2),
            "peak_rss_bytes": rss,
            "median_peak_rss_MB": round(statistics.median(rss) / MB, 1),
            "max_peak_rss_MB": round(max(rss) / MB, 1),
            "output_files": rs[0]["output_files"],
            "output_bytes": rs[0]["output_bytes"],
        }
    return arms


def judge(arms: dict[str, Any], largest: int) -> dict[str, Any]:
    copy_tp = arms["copy"]["throughput_MBps"]
    limit = 2 * largest + MEMORY_SLACK
    tp: dict[str, Any] = {}
    mem: dict[str, Any] = {}
    for t in TARGETS:
        ratio = arms[t]["throughput_MBps"] / copy_tp
        tp[t] = {"ratio_to_copy": round(ratio, 3), "pass": ratio >= THROUGHPUT_BAR}
        worst = max(arms[t]["peak_rss_bytes"])
        mem[t] = {"max_peak_rss_MB": round(worst / MB, 1), "pass": worst < limit}
    return {
        "throughput": {
            "rule": "median convert throughput >= 1/3 of the median copy throughput",
            "copy_MBps": copy_tp,
            "threshold_MBps": round(copy_tp * THROUGHPUT_BAR, 1),
            "targets": tp,
        },
        "memory": {
            "rule": "worst-run peak RSS < 2 x largest source tensor + 300 MB (MB = 10^6 B)",
            "largest_tensor_bytes": largest,
            "limit_MB": round(limit / MB, 1),
            "targets": mem,
        },
        "all_pass": all(v["pass"] for v in [*tp.values(), *mem.values()]),
    }


# ============================================================================ outputs
def _labelled_bars(ax: Any, names: list[str], values: list[float], targets: dict[str, Any]) -> None:
    """One bar per arm, each labelled with its value: the plain copy grey, each target green
    where it met the bar, red where it did not."""
    colors = ["0.55"] + ["tab:green" if targets[t]["pass"] else "tab:red" for t in TARGETS]
    ax.bar(names, values, color=colors)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)


def plot(result: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    arms = result["arms"]
    bars = result["bars"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(ARMS)
    tps = [arms[a]["throughput_MBps"] for a in names]
    _labelled_bars(ax1, names, tps, bars["throughput"]["targets"])
    thr = bars["throughput"]["threshold_MBps"]
    ax1.axhline(thr, color="k", ls="--", lw=1, label=f"bar: copy / 3 = {thr:.0f} MB/s")
    ax1.set_ylabel("MB/s (source bytes / child wall time, median)")
    ax1.set_title("convert throughput vs plain copy")
    ax1.legend(fontsize=8, loc="lower right")
    rss = [arms[a]["max_peak_rss_MB"] for a in names]
    _labelled_bars(ax2, names, rss, bars["memory"]["targets"])
    lim = bars["memory"]["limit_MB"]
    largest = bars["memory"]["largest_tensor_bytes"] / MB
    ax2.axhline(lim, color="k", ls="--", lw=1, label=f"bar: 2 x largest + 300 = {lim:.0f} MB")
    ax2.axhline(largest, color="tab:blue", ls=":", lw=1, label=f"largest tensor {largest:.0f} MB")
    ax2.set_ylabel("MB (child ru_maxrss, worst run)")
    ax2.set_title("peak resident memory")
    ax2.legend(fontsize=8, loc="upper left")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=8)
    src = result["checkpoint"]
    fig.suptitle(
        f"nvfp4 convert, {src['input_bytes'] / 1e9:.2f} GB ModelOpt checkpoint "
        f"({src['shards']} shards), {result['machine']['cores']} cores",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown(result: dict[str, Any], png: str | None) -> str:
    m, ck, arms, bars = result["machine"], result["checkpoint"], result["arms"], result["bars"]
    spec = result["spec"]
    yes = {True: "**yes**", False: "no"}
    lines = [
        "# `nvfp4 convert`: throughput and peak memory against a plain copy",
        "",
        "Produced by `benchmarks/convert.py` (raw figures: `benchmarks/results/convert.json`)"
        f" on {result['date']}. Every arm ran as a fresh child process in the same run; each "
        f"figure is the median of {result['runs']} rounds (peak memory: the worst round).",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 2**30:.1f} GiB RAM; "
        f"Python {m['python']}, numpy {m['versions']['numpy']}, "
        f"nvfp4 {m['versions']['nvfp4']}, gguf {m['versions']['gguf']}",
        f"- load average at start / end: {result['load_average']['start']} / "
        f"{result['load_average']['end']} (2 cores; other work may run alongside)",
        f"- source: synthetic ModelOpt NVFP4 Llama ({spec['layers']} layers, hidden "
        f"{spec['hidden']}, intermediate {spec['intermediate']}, {spec['heads']}/"
        f"{spec['kv_heads']} heads, vocab {spec['vocab']}): {ck['input_bytes'] / 1e9:.3f} GB in "
        f"{ck['files']} files ({ck['shards']} safetensors shards + index + configs), "
        f"{ck['nvfp4_weights']} NVFP4 weights with input scales, bf16 embeddings / lm_head / "
        f"norms; largest tensor `{ck['largest_tensor']['name']}` "
        f"{ck['largest_tensor']['bytes'] / MB:.1f} MB, largest NVFP4 weight "
        f"{ck['largest_nvfp4_weight']['bytes'] / MB:.1f} MB (codes + scales)",
        f"- page cache: warm, nothing dropped; before each round the parent read the source "
        f"once at {', '.join(f'{x:.2f}' for x in result['warm_read_GBps'])} GB/s (the first "
        "is the build's or a cold read, the others show the source stayed cached); `sync` "
        "before each arm; outputs on the same file system, deleted after each arm (untimed)",
        "- copy: a child `python -c` that `shutil.copyfile`-s each file then fsyncs it and the "
        "directory (the converters fsync their outputs too)",
        f"- convert: `python -m nvfp4_checkpoints.cli convert SRC DST --to T` (Hugging Face targets with "
        f"`--max-shard-bytes {spec['shard_bytes']}`, the source's, so they write as many "
        "files as the copy); its wall time includes "
        f"interpreter start-up and imports ({result['cli_startup_s']:.2f} s for "
        "`python -m nvfp4_checkpoints.cli --help`)",
        "- peak memory: the child's `ru_maxrss` (GNU `/usr/bin/time -f %M`), which counts "
        "touched memory-mapped source pages",
        f"- run time: {result['total_s']:.0f} s",
        "",
        "## Bars",
        "",
        "| target | throughput / copy | >= 1/3 | worst peak RSS (MB) | < "
        f"{bars['memory']['limit_MB']:.0f} MB |",
        "|---|---:|---|---:|---|",
    ]
    for t in TARGETS:
        tp, mem = bars["throughput"]["targets"][t], bars["memory"]["targets"][t]
        lines.append(
            f"| {t} | {tp['ratio_to_copy']:.2f} | {yes[tp['pass']]} | "
            f"{mem['max_peak_rss_MB']:.0f} | {yes[mem['pass']]} |"
        )
    lines += [
        "",
        f"All bars met: {yes[bars['all_pass']]}.",
        "",
        "## Figures",
        "",
        "| arm | median wall s | MB/s | in-process s (CLI) | child CPU s | peak RSS MB "
        "median / max | output files, MB | wall s per round |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for a in ARMS:
        r = arms[a]
        inproc = "-" if r["median_in_process_s"] is None else f"{r['median_in_process_s']:.2f}"
        lines.append(
            f"| {a} | {r['median_wall_s']:.2f} | {r['throughput_MBps']:.0f} | {inproc} | "
            f"{r['median_cpu_s']:.2f} | "
            f"{r['median_peak_rss_MB']:.0f} / {r['max_peak_rss_MB']:.0f} | "
            f"{r['output_files']}, {r['output_bytes'] / MB:.0f} | "
            f"{', '.join(f'{w:.2f}' for w in r['wall_s'])} |"
        )
    if result.get("verify"):
        lines += ["", "## Outputs checked (`nvfp4 verify SRC OUT`, untimed)", ""]
        lines += [f"- {t}: {v}" for t, v in result["verify"].items()]
    if png:
        lines += ["", f"![convert throughput and peak memory]({png})"]
    return "\n".join(lines) + "\n"


# =============================================================================== main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--workdir", type=Path, help="cache dir for the source (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the source checkpoint")
    ap.add_argument("--runs", type=int, default=3, help="rounds (median)")
    ap.add_argument("--layers", type=int, default=ModelSpec.layers, help="decoder layers")
    ap.add_argument("--no-verify", action="store_true", help="skip the untimed verify pass")
    ap.add_argument("--quick", action="store_true", help="tiny smoke test; prints only")
    args = ap.parse_args()
    spec = QUICK_SPEC if args.quick else dataclasses.replace(ModelSpec(), layers=args.layers)
    runs_n = 1 if args.quick else args.runs

    t_start = time.perf_counter()
    load_start = load_average()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nvfp4-bench-convert-"))
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "src"
    try:
        built = prepare_source(workdir, spec)
        how = "reused" if built["reused"] else f"built in {built['build_s']} s"
        print(f"source {src}: {how}", flush=True)
        ck = describe_source(src)
        print(
            f"  {ck['input_bytes'] / 1e9:.3f} GB, {ck['shards']} shards, "
            f"largest tensor {ck['largest_tensor']}",
            flush=True,
        )
        startup = startup_cost(workdir)
        runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
        warm: list[float] = []
        for r in range(runs_n):
            warm.append(warm_read(src))
            order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
            for arm in order:
                res = run_arm(arm, src, workdir, spec.shard_bytes)
                runs[arm].append(res)
                print(
                    f"round {r + 1} {arm:>18}: {res['wall_s']:6.2f} s "
                    f"{ck['input_bytes'] / res['wall_s'] / MB:7.0f} MB/s  "
                    f"peak RSS {res['peak_rss_bytes'] / MB:6.0f} MB",
                    flush=True,
                )
        verdicts = {} if args.no_verify else verify_outputs(src, workdir, spec.shard_bytes)
        for t, v in verdicts.items():
            print(f"verify {t}: {v}", flush=True)
    finally:
        if not args.keep:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for p in [src, workdir / "src.stamp.json", *workdir.glob("out*")]:
                    remove(p)

    arms = summarize(runs, ck["input_bytes"])
    result: dict[str, Any] = {
        "benchmark": "convert",
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average": {"start": load_start, "end": load_average()},
        "spec": dataclasses.asdict(spec),
        "source": built,
        "checkpoint": ck,
        "runs": runs_n,
        "warm_read_GBps": [round(x, 2) for x in warm],
        "cli_startup_s": round(startup, 3),
        "arms": arms,
        "bars": judge(arms, ck["largest_tensor"]["bytes"]),
        "verify": verdicts,
    }
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    if args.quick:
        print(markdown(result, None))
        return 0
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(result, indent=1) + "\n")
    has_png = plot(result, DOCS_PNG)
    DOCS_MD.parent.mkdir(parents=True, exist_ok=True)
    DOCS_MD.write_text(markdown(result, DOCS_PNG.name if has_png else None))
    print(f"wrote {RESULTS_JSON}, {DOCS_MD}" + (f", {DOCS_PNG}" if has_png else ""))
    print(f"all bars met: {result['bars']['all_pass']} ({result['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
