"""Per-rank loading of an NVFP4 checkpoint (``nvfp4_checkpoints.load_rank``): each rank's
peak memory and load time at world sizes 1, 2, 4 and 8, and the sharded matmul against the
unsharded one.

A synthetic ModelOpt NVFP4 checkpoint (``convert.py``'s builder: Llama-like names and
shapes, random valid planes, bf16 embeddings / lm_head / norms; by default 4 layers of
hidden 4096 / intermediate 14336, vocab 8192: about 0.49 GB of NVFP4 weights and 0.13 GB of
bf16) is written in a temporary folder by a child process. Then, for every world size, the
ranks are started together as real processes (``python -c``), each loading its own rank:

* ``rank`` arm: ``load_rank(SRC, rank, world)`` (only the rank's bytes read);
* ``whole`` arm, the path before: ``open_checkpoint(SRC)`` and, tensor by tensor,
  ``shard_planes(ck.planes(name), plan_for(...), rank)`` copied out (every byte of every
  tensor read and validated by every rank; memory-mapped, one tensor at a time).

Each child measures its peak resident set after its imports (the interpreter baseline) and
after loading: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` and, on Linux, ``VmHWM`` of
``/proc/self/status`` (the process's own high-water mark; ``ru_maxrss`` may carry the
spawning process's across ``exec``); a rank's load memory is peak minus baseline. The page
cache is warm (the parent reads the source before each world). Load time is the child's own
``perf_counter`` around the load; the ranks of a world share the machine's cores, as they
would on one host.

Goal (the issue's): every rank's load memory <= 1/N of the checkpoint's tensor bytes +
300 MB (MB = 10^6 bytes).

The matmul: one MLP (layer 0's gate_proj, column-parallel by the paired plan, and
down_proj, row-parallel over K) on the ``cpu`` backend (else the reference), one thread:
the whole layer's time against each rank's shards' time (the slowest rank is the critical
path; the all-reduce is not included), at M = 1 and 16, the calls of the whole layer and
of every rank taken in 3 turns (a slow spell of the machine spread over them), each after
reading a 640 MB buffer (the weights come from memory, as in a decode step of a large
model: warm, a rank's small shard would stay in the cache and look faster than it is).

``--fused``: the same checkpoint in Phi-3's layout (q/k/v fused as one ``qkv_proj``, gate/up
as one ``gate_up_proj``; ModelOpt's one global a tensor): each fused tensor is split per
partition (q by heads, k/v by KV heads, gate and up by down's K plan), so ``load_rank``
reads one range of rows a partition; the matmul's column-parallel layer is ``gate_up_proj``
(both halves: twice gate_proj's rows).

Writes ``benchmarks/results/shard_load.json`` and ``docs/benchmark_results/shard_load.md``
(``shard_load_fused.*`` with ``--fused``); ``--quick`` (a tiny checkpoint, one round) only
prints.

    python benchmarks/shard_load.py [--layers 4] [--rounds 2] [--reps 9] [--fused] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convert import (
    ModelSpec,
    child_env,
    describe_source,
    load_average,
    machine_info,
    source_files,
    warm_read,
)
from machine import simd_flags

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs" / "benchmark_results"
MB = 1_000_000
SLACK = 300 * MB
WORLDS = (1, 2, 4, 8)
ARMS = ("rank", "whole")
SPEC = ModelSpec(layers=4, vocab=8192)
#: ``--quick``: 8 query and 8 KV heads, so that 8 ranks get a head each.
QUICK_SPEC = ModelSpec(
    layers=2, hidden=256, intermediate=512, heads=8, kv_heads=8, vocab=1024, shard_bytes=400_000
)
MS = (1, 16)
FLUSH_BYTES = 640 * MB
#: The turns a matmul point's calls are taken in.
ROUNDS = 3

BUILD_CHILD = """
import json, sys
from pathlib import Path
from convert import ModelSpec, build_source
spec = ModelSpec(**json.loads(sys.argv[2]))
print(build_source(Path(sys.argv[1]), spec))
"""

RANK_CHILD = """
import json, resource, sys, time
import numpy as np
import nvfp4
from nvfp4.fused_plan import FusedPlan
from nvfp4.shard_planes import shard_fused, shard_planes
from nvfp4_checkpoints import load_rank, open_checkpoint
from nvfp4_checkpoints.shard import plan_for


def hwm():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None


def maxrss():
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024


arm, src, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = {"maxrss": maxrss(), "hwm": hwm()}
t0 = time.perf_counter()
if arm == "rank":
    s = load_rank(src, rank, world)
    planes, tensors, read = s.planes, s.tensors, s.bytes_read
else:
    planes, tensors = {}, {}
    with open_checkpoint(src) as ck:
        for name in ck.quantized_names():
            n, k = ck.plane_shape(name).shape[-2:]
            plan = plan_for(name, n, k, world, 1, ck.config)
            cut = shard_fused if isinstance(plan, FusedPlan) else shard_planes
            p = cut(ck.planes(name), plan, rank)
            planes[name] = p.replace(codes=p.codes.copy(), scales=p.scales.copy())
        tensors = {n: np.array(ck.tensor(n)) for n in ck.tensor_names()}
    read = None
load_s = time.perf_counter() - t0
print(json.dumps({
    "load_s": load_s,
    "base": base,
    "peak": {"maxrss": maxrss(), "hwm": hwm()},
    "held_nvfp4": sum(p.codes.nbytes + p.scales.nbytes for p in planes.values()),
    "held_other": sum(t.nbytes for t in tensors.values()),
    "bytes_read": read,
}))
"""


def build(src: Path, spec: ModelSpec) -> float:
    """Write the source in a child process (the parent stays small: a child started from a
    large parent may report its high-water mark)."""
    out = subprocess.run(
        [sys.executable, "-c", BUILD_CHILD, str(src), json.dumps(dataclasses.asdict(spec))],
        cwd=Path(__file__).parent,
        env=child_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def run_world(arm: str, src: Path, world: int) -> dict[str, Any]:
    """Start the ``world`` ranks of ``arm`` together; wait for all; their reports."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_CHILD, arm, str(src), str(r), str(world)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    ranks = []
    for r, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"{arm} rank {r}/{world} failed: {err.strip()[-2000:]}")
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    for rep in ranks:
        for key in ("maxrss", "hwm"):
            b, p = rep["base"][key], rep["peak"][key]
            rep[f"load_mem_{key}"] = None if b is None or p is None else p - b
    return {"wall_s": wall, "ranks": ranks}


def qmm_times(src: Path, worlds: tuple[int, ...], reps: int, gate_name: str) -> dict[str, Any]:
    """The MLP of layer 0 (``gate_name``: ``gate_proj``, or a fused ``gate_up_proj``, then
    ``down_proj``), whole against each rank's shards, one thread, median of ``reps`` calls
    (M = 1 and 16), each after reading :data:`FLUSH_BYTES` (a cold cache)."""
    os.environ["NVFP4_CPU_THREADS"] = "1"
    import numpy as np
    import nvfp4
    from nvfp4.fused_plan import FusedPlan
    from nvfp4.shard_planes import shard_fused, shard_planes
    from nvfp4_checkpoints import open_checkpoint
    from nvfp4_checkpoints.shard import plan_for

    try:
        be = nvfp4.get_backend("cpu")
        name = "cpu"
        isa = str(be.isa)
    except Exception:  # any reason the cpu backend cannot run here
        be, name, isa = nvfp4.get_backend("reference"), "reference", "numpy"
    layer = "model.layers.0.mlp."
    with open_checkpoint(src) as ck:
        whole = {p: ck.planes(layer + p) for p in (gate_name, "down_proj")}
        whole = {
            p: w.replace(codes=w.codes.copy(), scales=w.scales.copy()) for p, w in whole.items()
        }
        config = ck.config

    # read between calls, so that every call reads its weight from memory, as a decode
    # step of a model far larger than the cache does (twice the 300 MiB L3 of the machine
    # the figures were taken on)
    flush_buf = np.ones(FLUSH_BYTES // 8, np.uint64)

    def medians(calls: list[tuple[Any, Any]]) -> list[float]:
        """The median time of every ``(handle, x)`` call, its ``reps`` calls taken in
        :data:`ROUNDS` turns across all of them (a slow spell of a shared machine is spread
        over every arm), each after reading the flush buffer."""
        times: list[list[float]] = [[] for _ in calls]
        for handle, x in calls:
            be.qmm(x, handle)  # warm
        for turn in range(ROUNDS):
            for i, (handle, x) in enumerate(calls):
                for _ in range(reps // ROUNDS + (turn < reps % ROUNDS)):
                    flush_buf.sum()
                    t0 = time.perf_counter()
                    be.qmm(x, handle)
                    times[i].append(time.perf_counter() - t0)
        return [statistics.median(t) for t in times]

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {
        "backend": name,
        "isa": isa,
        "threads": 1,
        "reps": reps,
        "column_layer": gate_name,
        "points": [],
    }
    gate, down = whole[gate_name], whole["down_proj"]
    handles = {"gate": be.prepare(gate), "down": be.prepare(down)}
    for m in MS:
        x = rng.standard_normal((m, gate.k)).astype(np.float32)
        h = rng.standard_normal((m, down.k)).astype(np.float32)
        for world in worlds:
            g_plan = plan_for(layer + gate_name, gate.n, gate.k, world, 1, config)
            cut_gate = shard_fused if isinstance(g_plan, FusedPlan) else shard_planes
            d_plan = plan_for(layer + "down_proj", down.n, down.k, world, 1, config)
            # the whole layer timed again beside every world's ranks, in the same turns
            calls = [(handles["gate"], x), (handles["down"], h)]
            for r in range(world):
                rr = d_plan[r]
                hr = np.zeros((m, rr.padded), np.float32)
                hr[:, : rr.size] = h[:, rr.start : rr.stop]
                calls.append((be.prepare(cut_gate(gate, g_plan, r)), x))
                calls.append((be.prepare(shard_planes(down, d_plan, r)), hr))
            t = medians(calls)
            t_whole = t[0] + t[1]
            per_rank = [t[2 + 2 * r] + t[3 + 2 * r] for r in range(world)]
            out["points"].append(
                {
                    "m": m,
                    "world": world,
                    "whole_s": t_whole,
                    "rank_s": per_rank,
                    "speedup_slowest": t_whole / max(per_rank),
                    "work_ratio": sum(per_rank) / t_whole,
                }
            )
            print(
                f"qmm M={m:>2} world {world}: whole {t_whole * 1e3:7.2f} ms, slowest rank "
                f"{max(per_rank) * 1e3:7.2f} ms (x{t_whole / max(per_rank):.2f}), sum of ranks "
                f"/ whole {sum(per_rank) / t_whole:.2f}",
                flush=True,
            )
    return out


def judge(worlds: dict[str, Any], tensor_bytes: int) -> dict[str, Any]:
    """The goal per world size: the worst rank's load memory in the ``rank`` arm (its
    worst round), ``VmHWM`` where the OS gives it, else ``ru_maxrss``."""
    out = {}
    for world, arms in worlds.items():
        ranks = arms["rank"]["ranks"]
        key = "load_mem_hwm" if ranks[0]["load_mem_hwm"] is not None else "load_mem_maxrss"
        worst = max(r[key] for r in ranks)
        bar = tensor_bytes / int(world) + SLACK
        out[world] = {"worst_load_mem": worst, "bar": bar, "met": worst <= bar, "measure": key}
    return out


def write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary sibling renamed at the end."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one (arm, world) folded: per rank, the median load time and the worst
    memory; the median wall time."""
    ranks = []
    for r in range(len(runs[0]["ranks"])):
        reps = [run["ranks"][r] for run in runs]
        ranks.append(
            {
                "load_s": statistics.median(x["load_s"] for x in reps),
                "load_mem_maxrss": max(x["load_mem_maxrss"] for x in reps),
                "load_mem_hwm": None
                if reps[0]["load_mem_hwm"] is None
                else max(x["load_mem_hwm"] for x in reps),
                "base_maxrss": reps[0]["base"]["maxrss"],
                "held_nvfp4": reps[0]["held_nvfp4"],
                "held_other": reps[0]["held_other"],
                "bytes_read": reps[0]["bytes_read"],
            }
        )
    return {"wall_s": statistics.median(run["wall_s"] for run in runs), "ranks": ranks}


def markdown(res: dict[str, Any]) -> str:
    m, src = res["machine"], res["source"]
    q = res["qmm"]
    layout = (
        "Phi-3 layout (q/k/v fused as one `qkv_proj`, gate/up as one `gate_up_proj`, each "
        "split per partition)"
        if res["spec"]["fused"]
        else "Llama"
    )
    column = q["column_layer"]
    lines = [
        "# Per-rank loading: peak memory and load time per rank, sharded matmul",
        "",
        f"Produced by `benchmarks/shard_load.py{' --fused' if res['spec']['fused'] else ''}` "
        f"(raw figures: `benchmarks/results/{res['name']}.json`) "
        f"on {res['date']}. Each world size's ranks ran as separate processes started together; "
        f"figures are the median of {res['rounds']} rounds (memory: the worst round).",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 2**30:.1f} GiB RAM; "
        f"Python {m['python']}, numpy {m['versions']['numpy']}, nvfp4 {m['versions']['nvfp4']}",
        f"- SIMD flags: {' '.join(res['simd_flags']) or 'none listed'}; matmul on the "
        f"`{q['backend']}` backend, ISA path `{q['isa']}`, {q['threads']} thread",
        f"- load average at start / end: {res['load_average']['start']} / "
        f"{res['load_average']['end']} ({m['cores']} cores; other work may run alongside)",
        f"- source: synthetic ModelOpt NVFP4 {layout} ({res['spec']['layers']} layers, hidden "
        f"{res['spec']['hidden']}, intermediate {res['spec']['intermediate']}, "
        f"{res['spec']['heads']}/{res['spec']['kv_heads']} heads, vocab {res['spec']['vocab']}): "
        f"{src['input_bytes'] / MB:.0f} MB in {src['shards']} safetensors files; tensors "
        f"{res['tensor_bytes'] / MB:.0f} MB, of which NVFP4 {res['nvfp4_bytes'] / MB:.0f} MB "
        f"(codes + scales) and bf16 {res['other_bytes'] / MB:.0f} MB (embeddings, lm_head, "
        "norms: every rank holds them whole)",
        "- memory: a rank's load memory is its peak resident set after loading minus its "
        "peak after its imports (`VmHWM` of `/proc/self/status`, the process's own "
        "high-water mark; `ru_maxrss` beside it); page cache warm",
        f"- run time: {res['run_s']:.0f} s",
        "",
        "## Goal: a rank's load memory <= 1/N of the tensor bytes + 300 MB",
        "",
        "| world N | worst rank's load memory (MB) | bar (MB) | met |",
        "|---:|---:|---:|---|",
    ]
    for world, g in res["goals"].items():
        lines.append(
            f"| {world} | {g['worst_load_mem'] / MB:.0f} | {g['bar'] / MB:.0f} | "
            f"**{'yes' if g['met'] else 'no'}** |"
        )
    lines += [
        "",
        f"All goals met: **{'yes' if all(g['met'] for g in res['goals'].values()) else 'no'}**.",
        "",
        "## Loading",
        "",
        "`rank`: `load_rank(SRC, rank, N)`; `whole`: `open_checkpoint` and "
        "`shard_planes(ck.planes(name), plan, rank)` per tensor (`shard_fused` for a fused "
        "one; the path before).",
        "",
        "| N | arm | wall s (all ranks) | load s per rank (median / max) | load memory MB "
        "(median / max; `ru_maxrss`: max) | NVFP4 held MB per rank (max) | bytes read MB "
        "per rank (max) |",
        "|---:|---|---:|---|---|---:|---:|",
    ]
    for world, arms in res["worlds"].items():
        for arm in ARMS:
            a = arms[arm]
            rk = a["ranks"]
            loads = [r["load_s"] for r in rk]
            key = "load_mem_hwm" if rk[0]["load_mem_hwm"] is not None else "load_mem_maxrss"
            mems = [r[key] for r in rk]
            read = [r["bytes_read"] for r in rk if r["bytes_read"] is not None]
            # the whole arm maps and validates every tensor (its copies: the rank's shards)
            read_cell = f"{max(read) / MB:.0f}" if read else f"all ({res['tensor_bytes'] / MB:.0f})"
            lines.append(
                f"| {world} | {arm} | {a['wall_s']:.2f} | {statistics.median(loads):.2f} / "
                f"{max(loads):.2f} | {statistics.median(mems) / MB:.0f} / {max(mems) / MB:.0f}"
                f" ({max(r['load_mem_maxrss'] for r in rk) / MB:.0f}) | "
                f"{max(r['held_nvfp4'] for r in rk) / MB:.0f} | "
                f"{read_cell} |"
            )
    lines += [
        "",
        f"## Sharded matmul (one MLP: {column} column-parallel, down_proj row-parallel)",
        "",
        f"`{q['backend']}` backend (`{q['isa']}`), one thread, median of {q['reps']} calls "
        f"taken in {ROUNDS} turns across the whole layer and every rank, "
        f"each after reading a {FLUSH_BYTES // MB} MB buffer (cold cache: weights from memory); "
        "each rank's shards timed in turn in one process: the slowest rank is the critical "
        "path if every rank has a core (the all-reduce of down_proj's partials not included).",
        "",
        "| M | N | whole ms | slowest rank ms | whole / slowest | sum of ranks / whole |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for p in q["points"]:
        lines.append(
            f"| {p['m']} | {p['world']} | {p['whole_s'] * 1e3:.2f} | "
            f"{max(p['rank_s']) * 1e3:.2f} | {p['speedup_slowest']:.2f} | "
            f"{p['work_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--layers", type=int, default=SPEC.layers, help="decoder layers")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per world size (median)")
    ap.add_argument("--reps", type=int, default=9, help="matmul calls per point (median)")
    ap.add_argument("--fused", action="store_true", help="Phi-3's fused q/k/v and gate/up")
    ap.add_argument("--quick", action="store_true", help="tiny smoke test; prints only")
    args = ap.parse_args()
    spec = QUICK_SPEC if args.quick else dataclasses.replace(SPEC, layers=args.layers)
    spec = dataclasses.replace(spec, fused=args.fused)
    name = "shard_load_fused" if args.fused else "shard_load"
    rounds = 1 if args.quick else args.rounds
    t_start = time.perf_counter()
    load_start = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="nvfp4-bench-shard-load-"))
    src = workdir / "src"
    try:
        build_s = build(src, spec)
        desc = describe_source(src)
        from nvfp4_checkpoints.safetensors_io import read_header

        sizes: dict[str, int] = {}
        for f in source_files(src):
            if f.suffix == ".safetensors":
                sizes.update({n: i.nbytes for n, i in read_header(f)[0].items()})
        nvfp4_bytes = sum(
            v
            for n, v in sizes.items()
            if n.endswith((".weight", ".weight_scale"))
            and n.rsplit(".", 1)[0] + ".weight_scale" in sizes
        )
        tensor_bytes = sum(sizes.values())
        print(
            f"source: {desc['input_bytes'] / MB:.0f} MB, built in {build_s:.1f} s; NVFP4 "
            f"{nvfp4_bytes / MB:.0f} MB of {tensor_bytes / MB:.0f} MB of tensors",
            flush=True,
        )
        raw: dict[str, dict[str, list[dict[str, Any]]]] = {
            str(w): {a: [] for a in ARMS} for w in WORLDS
        }
        for rnd in range(rounds):
            for world in WORLDS:
                for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                    warm_read(src)
                    res = run_world(arm, src, world)
                    raw[str(world)][arm].append(res)
                    mems = [r["load_mem_hwm"] or r["load_mem_maxrss"] for r in res["ranks"]]
                    print(
                        f"round {rnd + 1} N={world} {arm:>5}: wall {res['wall_s']:5.2f} s, "
                        f"load s max {max(r['load_s'] for r in res['ranks']):5.2f}, load memory "
                        f"max {max(mems) / MB:6.0f} MB",
                        flush=True,
                    )
        gate_name = "gate_up_proj" if spec.fused else "gate_proj"
        qmm = qmm_times(src, WORLDS, 5 if args.quick else args.reps, gate_name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    worlds = {w: {a: summary(runs) for a, runs in arms.items()} for w, arms in raw.items()}
    result = {
        "benchmark": "shard_load",
        "name": name,
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "simd_flags": simd_flags(),
        "load_average": {"start": load_start, "end": load_average()},
        "spec": dataclasses.asdict(spec),
        "source": desc,
        "build_s": build_s,
        "tensor_bytes": tensor_bytes,
        "nvfp4_bytes": nvfp4_bytes,
        "other_bytes": tensor_bytes - nvfp4_bytes,
        "rounds": rounds,
        "worlds": worlds,
        "goals": judge(worlds, tensor_bytes),
        "qmm": qmm,
        "run_s": time.perf_counter() - t_start,
    }
    for world, g in result["goals"].items():
        print(
            f"goal N={world}: worst rank {g['worst_load_mem'] / MB:.0f} MB <= "
            f"{g['bar'] / MB:.0f} MB: {'yes' if g['met'] else 'NO'}"
        )
    if args.quick:
        return 0
    results_json, docs_md = RESULTS / f"{name}.json", DOCS / f"{name}.md"
    write_atomic(results_json, json.dumps(result, indent=1) + "\n")
    write_atomic(docs_md, markdown(result))
    print(f"wrote {results_json.relative_to(REPO)} and {docs_md.relative_to(REPO)}")
    return 0 if all(g["met"] for g in result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
