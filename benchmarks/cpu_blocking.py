"""nvfp4-cpu W4A16 blocking: the schedule before the cache plan against the plan derived from
the caches (this machine's, and a Zen 3's through NVFP4_CPU_CACHE's values) and the best of a
small grid of plans, at M = 1 .. 512, on one and two threads.

Arms (every one the same library and level, in the same process; only the plan differs, and
no plan changes a result: the outputs of every arm are compared byte for byte first):

* ``old``       - kc 0 (the whole K in one slab: every tile reads the whole activation panel),
                  4 tiles per work item: the schedule before the plan;
* ``plan``      - the plan derived from this machine's caches (sysfs / CPUID);
* ``plan_zen3`` - the plan derived from a Zen 3's caches (L1d 32K, L2 512K, L3 32M), as
                  ``NVFP4_CPU_CACHE=l1d=32K,l2=512K,l3=32M`` would choose it, timed here;
* ``best``      - per point, the fastest of the grid (the arms above and kc 512 / 2048 /
                  8192 with 8 tiles, kc 1024 / 4096 with 4).

Shapes: S = 4096 x 4096, L = 14336 x 8192, W = 2048 x 32768 (a wide K: the panel of a
32-row chunk is 4 MiB, twice this Xeon's L2, where a 4096-wide K's panel fits it). One
thread is timed by the CPU time of the calling thread (the kernels run on it alone), so other
work on a shared machine does not count; two threads by wall time. Each point is the median
of ``--rounds`` interleaved rounds (every plan once per round).

The level is forced (``--isa``, default avx2): on an AVX-512 CPU the AVX2 level runs the same
code as on an AVX2-only one, but with this CPU's caches and memory; the summary says which.

Writes ``benchmarks/results/cpu_blocking.json`` and ``docs/benchmark_results/cpu_blocking.md``
(``--quick``: tiny shapes, ``..._quick``, a smoke test; ``--tag NAME``: ``cpu_blocking_NAME.*``,
a second machine's run beside the committed one). Run from the repository root with
nvfp4-cpu installed: ``python benchmarks/cpu_blocking.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nvfp4  # noqa: E402
from machine import cpu_model, simd_flags  # noqa: E402
from nvfp4_cpu import plan as cpu_plan  # noqa: E402
from nvfp4_cpu._native import load  # noqa: E402
from nvfp4_cpu.layout import prepare  # noqa: E402
from nvfp4_cpu.ops import qmm_f32  # noqa: E402

SHAPES = {"S": (4096, 4096), "L": (14336, 8192), "W": (2048, 32768)}
MS = (1, 8, 32, 64, 128, 256, 512)
ZEN3 = (32 << 10, 512 << 10, 32 << 20)
OLD = (0, 32, 4)
GRID_EXTRA = [(512, 32, 8), (2048, 32, 8), (8192, 32, 8), (1024, 32, 4), (4096, 32, 4)]


def random_planes(n: int, k: int, seed: int) -> nvfp4.NVFP4Planes:
    """Random codes and scale bytes (E4M3 0.5 .. 4), global 0.01: speed does not depend on
    the values."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x30, 0x48, (n, k // 16), dtype=np.uint8)
    return nvfp4.NVFP4Planes(codes, scales, np.array(0.01, np.float32), name=f"w{n}x{k}")


def time_point(
    native: Any,
    isa: str,
    threads: int,
    w: Any,
    x: np.ndarray,
    plans: list[tuple[int, int, int]],
    caches: tuple[int, int, int],
    rounds: int,
) -> dict[tuple[int, int, int], float]:
    """Median seconds per call of each plan, in interleaved rounds (after one warm-up call
    each); the outputs of every plan are checked equal, bit for bit, first."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    m, n = x.shape[0], w.n
    flop = 2.0 * m * n * w.k
    reps = max(1, int(0.05 * 60e9 / flop))  # ~50 ms per sample at 60 GFLOP/s
    out = np.empty((m, n), np.float32)
    ref = None
    for p in plans:
        cpu_plan.put(native, caches, "given", p)
        qmm_f32(native, isa, threads, x, w, out)
        if ref is None:
            ref = out.copy()
        elif not np.array_equal(out.view(np.uint32), ref.view(np.uint32)):
            raise AssertionError(f"plan {p} gave other bits than {plans[0]} at M={m}")
    samples: dict[tuple[int, int, int], list[float]] = {p: [] for p in plans}
    for _ in range(rounds):
        for p in plans:
            cpu_plan.put(native, caches, "given", p)
            t = clock()
            for _ in range(reps):
                qmm_f32(native, isa, threads, x, w, out)
            samples[p].append((clock() - t) / reps)
    return {p: float(np.median(v)) for p, v in samples.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    native = load()
    own, source = cpu_plan.detect_caches(native)
    arms = {
        "old": OLD,
        "plan": cpu_plan.derive(native, own),
        "plan_zen3": cpu_plan.derive(native, ZEN3),
    }
    grid = list(dict.fromkeys([*arms.values(), *GRID_EXTRA]))
    shapes = {"S": (256, 1024), "W": (128, 8192)} if args.quick else SHAPES
    ms = (1, 8, 32) if args.quick else tuple(args.ms)
    load_start = os.getloadavg()
    t_start = time.perf_counter()
    points = []
    before = cpu_plan.current(native)
    try:
        for name, (n, k) in shapes.items():
            w = prepare(random_planes(n, k, 1), native, 2)
            for threads in args.threads:
                for m in ms:
                    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
                    secs = time_point(native, args.isa, threads, w, x, grid, own, args.rounds)
                    gf = {p: 2.0 * m * n * k / s / 1e9 for p, s in secs.items()}
                    best = max(gf, key=lambda p: gf[p])
                    row = {
                        "shape": name,
                        "n": n,
                        "k": k,
                        "m": m,
                        "threads": threads,
                        "gflops": {a: gf[p] for a, p in arms.items()},
                        "best": gf[best],
                        "best_plan": list(best),
                        "grid": {",".join(map(str, p)): gf[p] for p in grid},
                    }
                    points.append(row)
                    print(
                        f"{name} T={threads} M={m:4d}: "
                        + "  ".join(f"{a} {row['gflops'][a]:6.1f}" for a in arms)
                        + f"  best {gf[best]:6.1f} {best}",
                        flush=True,
                    )
    finally:
        cpu_plan.put(native, before.caches, before.source, before.blocking)
    return {
        "script": "benchmarks/cpu_blocking.py",
        "quick": args.quick,
        "cpu_model": cpu_model(),
        "simd_flags": simd_flags(),
        "isa": args.isa,
        "isa_native": not native.supported("avx512") if args.isa == "avx2" else True,
        "caches": {"l1d": own[0], "l2": own[1], "l3": own[2], "source": source},
        "arms": {a: list(p) for a, p in arms.items()},
        "grid": [list(p) for p in grid],
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "seconds": time.perf_counter() - t_start,
        "points": points,
    }


def no_drop(points: list[dict[str, Any]], arm: str, shape: str, threads: int) -> float | None:
    """min over M in 32..512 of the arm's GF/s, over the best GF/s of that arm at any M."""
    rows = [p for p in points if p["shape"] == shape and p["threads"] == threads]
    if not rows:
        return None
    get = (lambda p: p["best"]) if arm == "best" else (lambda p: p["gflops"][arm])
    late = [get(p) for p in rows if p["m"] >= 32]
    return min(late) / max(get(p) for p in rows) if late else None


def summary(d: dict[str, Any]) -> str:
    c = d["caches"]
    mib = 1 << 20
    arm_plan = ", ".join(
        f"`{a}` = kc {p[0] or 'whole K'}, kp {p[1]}, {p[2]} tiles" for a, p in d["arms"].items()
    )
    native = (
        "native"
        if d["isa_native"]
        else "forced (the level `NVFP4_CPU_ISA=avx2` selects) on a CPU that also has AVX-512"
    )
    lines = [
        "# nvfp4-cpu W4A16 blocking: the schedule before the cache plan, the plan, the best of a grid",
        "",
        f"Generated by `benchmarks/cpu_blocking.py` (raw figures: `benchmarks/results/"
        f"{d.get('stem') or ('cpu_blocking_quick' if d['quick'] else 'cpu_blocking')}.json`).",
        "",
        f"- **Machine**: {d['cpu_model']}; SIMD flags: {' '.join(d['simd_flags'])}.",
        f"- **Caches** ({c['source']}): L1d {c['l1d'] >> 10} KiB, L2 {c['l2'] / mib:g} MiB, "
        f"L3 {c['l3'] / mib:g} MiB.",
        f"- **ISA path**: {d['isa']}, {native}.",
        f"- **Arms** (one library, one process; only the plan differs): {arm_plan}; `best` = "
        "the fastest plan of the grid at each point ("
        + "; ".join(f"{p[0] or 'whole K'}/{p[1]}/{p[2]}" for p in d["grid"])
        + "; as the largest of 8 noisy medians it sits above the others by the noise alone).",
        "- **Same bits**: every plan's output was compared with the first plan's, byte for "
        "byte, at every point before timing (a difference stops the run).",
        f"- **Timing**: median of {d['rounds']} interleaved rounds; 1 thread by the calling "
        "thread's CPU time, 2 threads by wall time. Load average at start / end: "
        + " / ".join(", ".join(f"{v:.2f}" for v in d[k]) for k in ("loadavg_start", "loadavg_end"))
        + f"; {d['seconds']:.0f} s in all.",
        *(
            [
                f"- **Shared machine**: the load average ({d['loadavg_start'][0]:.1f} at the start) "
                f"exceeded the {d['cpus']} CPUs: the wall-time (2-thread) figures include other "
                "processes' time and move by 2x between neighbouring rows; compare the arms within "
                "a row only, and trust the 1-thread (CPU time) tables."
            ]
            if max(d["loadavg_start"][0], d["loadavg_end"][0]) > d["cpus"]
            else []
        ),
        "- **Not measured here**: a real Zen 3. `plan_zen3` is the plan a Zen 3 derives "
        "(what `NVFP4_CPU_CACHE=l1d=32K,l2=512K,l3=32M` gives), run on this machine's "
        "caches and memory: it shows that plan's cost here, not Zen 3's speed.",
        "",
    ]
    for shape in dict.fromkeys(p["shape"] for p in d["points"]):
        for threads in dict.fromkeys(p["threads"] for p in d["points"]):
            rows = [p for p in d["points"] if p["shape"] == shape and p["threads"] == threads]
            if not rows:
                continue
            n, k = rows[0]["n"], rows[0]["k"]
            lines += [
                f"## {shape} = {n} x {k}, {threads} thread{'s' if threads > 1 else ''} (GFLOP/s)",
                "",
                "| M | old | plan | plan_zen3 | best | best plan (kc/kp/tiles) | plan / old |",
                "|---:|---:|---:|---:|---:|---|---:|",
            ]
            for p in rows:
                g = p["gflops"]
                bp = p["best_plan"]
                lines.append(
                    f"| {p['m']} | {g['old']:.1f} | {g['plan']:.1f} | {g['plan_zen3']:.1f} | "
                    f"{p['best']:.1f} | {bp[0] or 'whole K'}/{bp[1]}/{bp[2]} | "
                    f"{g['plan'] / g['old']:.2f} |"
                )
            drops = {
                a: no_drop(d["points"], a, shape, threads)
                for a in ("old", "plan", "plan_zen3", "best")
            }
            lines += [
                "",
                "No drop past M = 8 (lowest GF/s at M = 32..512 over the arm's highest at any M; "
                "goal >= 0.90): "
                + ", ".join(f"{a} {v:.2f}" for a, v in drops.items() if v is not None)
                + ".",
                "",
            ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--ms", type=int, nargs="+", default=list(MS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    ap.add_argument(
        "--summary-only", action="store_true", help="rewrite the summary from the saved JSON"
    )
    ap.add_argument(
        "--tag",
        help="write cpu_blocking_<tag>.json / .md instead (a second machine's run beside the "
        "committed one)",
    )
    args = ap.parse_args()
    stem = "cpu_blocking" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
    res = ROOT / "benchmarks" / "results" / f"{stem}.json"
    doc = ROOT / "docs" / "benchmark_results" / f"{stem}.md"
    if args.summary_only:
        data = json.loads(res.read_text())
    else:
        data = run(args)
        data["stem"] = stem  # the files this run's summary names
        res.write_text(json.dumps(data, indent=1) + "\n")
    doc.write_text(summary(data) + "\n")
    print(f"wrote {res.relative_to(ROOT)} and {doc.relative_to(ROOT)}")
    return 0 if all(math.isfinite(p["best"]) for p in data["points"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
