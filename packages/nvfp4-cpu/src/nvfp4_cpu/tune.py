"""The optional tuner: ``python -m nvfp4_cpu.tune`` times a few candidate plans (kc, kp, tiles
per item; see ``csrc/plan.h``) on this machine for the given shapes and stores the fastest, per
CPU model, level and caches, in ``$XDG_CACHE_HOME/nvfp4/plans.json`` (``~/.cache`` when the
variable is unset), as FFTW keeps its wisdom. The backend reads the file when no
``NVFP4_CPU_CACHE`` is set (:func:`nvfp4_cpu.plan.apply`); without it, the plan derived from
the caches runs.

A candidate replaces the derived plan only when it is at least 3% faster (``MIN_GAIN``), by
the geometric mean over the shapes and row counts of each one's median time; otherwise the
entry for this machine is removed and the derived plan stays. No plan changes a result, only
speed.

The file is input: every value is checked where it is read, and a malformed file is refused
in one line naming the file, the entry and what was expected (the backend then warns once and
runs the derived plan; the tuner stops without touching it). It is written to a temporary
file and renamed, never deleted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import plan as plan_mod
from ._native import Native, load, resolve_isa
from .plans_file import (
    MAX_FILE_BYTES,
    machine_key,
    plans_file,
    read_plans,
    stored_blocking,
    write_plans,
)

__all__ = [
    "MAX_FILE_BYTES",
    "MIN_GAIN",
    "candidates",
    "choose",
    "machine_key",
    "plans_file",
    "read_plans",
    "stored_blocking",
    "write_plans",
]

#: How much faster (time ratio) a candidate must be to replace the derived plan.
MIN_GAIN = 0.97


def candidates(derived: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The derived plan first, then slabs of half, twice and four times its kc, the whole K,
    and the other item size: at most 8 plans."""
    kc, kp, group = derived
    other = 4 if group == 8 else 8
    out = [derived]
    for c in (kc // 2, kc * 2, kc * 4):
        c = c // 256 * 256
        if 256 <= c <= 16384:
            out.append((c, kp, group))
    out += [(0, kp, group), (kc, kp, other), (kc // 2 // 256 * 256 or 256, kp, other)]
    return list(dict.fromkeys(out))


def choose(
    times: dict[tuple[int, int, int], float], derived: tuple[int, int, int]
) -> tuple[tuple[int, int, int], float]:
    """The plan to keep and its time ratio to the derived plan: the fastest candidate when it
    takes at most MIN_GAIN of the derived plan's time, else the derived plan (ratio 1)."""
    best = min(times, key=lambda p: times[p])
    ratio = times[best] / times[derived]
    return (best, ratio) if ratio <= MIN_GAIN else (derived, 1.0)


def _time_plans(
    native: Native,
    isa: str,
    threads: int,
    shapes: Sequence[tuple[int, int]],
    ms: Sequence[int],
    plans: Sequence[tuple[int, int, int]],
    caches: tuple[int, int, int],
    source: str,
    rounds: int,
) -> dict[tuple[int, int, int], float]:
    """Geometric mean over (shape, M) of each plan's median time; rounds interleave the plans
    so a slow spell of the machine hits them all."""
    import nvfp4

    from .layout import prepare
    from .ops import qmm_f32

    # one thread: the CPU time of this thread, which other processes on the machine do not add to
    clock = time.thread_time if threads == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    logs = {p: 0.0 for p in plans}
    for n, k in shapes:
        codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(0x30, 0x48, (n, k // 16), dtype=np.uint8)
        w = prepare(nvfp4.NVFP4Planes(codes, scales, np.float32(0.01), name="tune"), native, 2)
        for m in ms:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            reps = max(1, int(2e8 / (2 * m * n * k)))  # ~ tens of ms per measurement
            samples: dict[tuple[int, int, int], list[float]] = {p: [] for p in plans}
            for _ in range(rounds + 1):  # the first round warms up and is dropped
                for p in plans:
                    plan_mod.put(native, caches, source, p)
                    t = clock()
                    for _ in range(reps):
                        qmm_f32(native, isa, threads, x, w, out)
                    samples[p].append((clock() - t) / reps)
            for p in plans:
                logs[p] += math.log(float(np.median(samples[p][1:])))
    count = len(shapes) * len(ms)
    return {p: math.exp(v / count) for p, v in logs.items()}


def _shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxK (e.g. 4096x4096), found {text!r}") from None
    if not (1 <= n <= 1 << 17 and 16 <= k <= 1 << 17 and k % 16 == 0):
        raise argparse.ArgumentTypeError(
            f"expected N in [1, 131072] and K a multiple of 16 in [16, 131072], found {text!r}"
        )
    return n, k


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m nvfp4_cpu.tune",
        description="Time candidate cache plans on this machine and store the fastest "
        "(when >= 3%% faster than the derived plan) in $XDG_CACHE_HOME/nvfp4/plans.json.",
    )
    ap.add_argument("--isa", help="level to tune (default: $NVFP4_CPU_ISA, else the best here)")
    ap.add_argument("--threads", type=int, default=None, help="threads per call (default: all)")
    ap.add_argument(
        "--shapes", type=_shape, nargs="+", default=[(4096, 4096), (14336, 8192)], help="NxK"
    )
    ap.add_argument("--m", type=int, nargs="+", default=[32, 128, 512], help="rows of x")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per plan (median)")
    ap.add_argument("--dry-run", action="store_true", help="time and report, store nothing")
    args = ap.parse_args(argv)
    if any(m < 1 or m > 4096 for m in args.m) or not 1 <= args.rounds <= 100:
        ap.error("--m values must be in [1, 4096] and --rounds in [1, 100]")
    if os.environ.get(plan_mod.CACHE_ENV):
        ap.error(f"${plan_mod.CACHE_ENV} is set: the tuner times this machine's own caches")
    from ._native import resolve_threads

    native = load()
    isa = resolve_isa(native, args.isa)
    threads = resolve_threads(args.threads)
    path = plans_file()
    try:
        stored = read_plans(path)
    except ValueError as exc:
        print(f"nvfp4-cpu tune: {exc}; move it away to tune again", file=sys.stderr)
        return 2
    caches, source = plan_mod.detect_caches(native)
    derived = plan_mod.derive(native, caches)
    plans = candidates(derived)
    before = plan_mod.current(native)
    t0 = time.perf_counter()
    try:
        times = _time_plans(
            native, isa, threads, args.shapes, args.m, plans, caches, source, args.rounds
        )
    finally:
        plan_mod.put(native, before.caches, before.source, before.blocking)
    best, ratio = choose(times, derived)
    print(
        f"{machine_key(isa, caches)}: {len(plans)} plans timed in {time.perf_counter() - t0:.1f} s"
    )
    for p in plans:
        mark = " <- kept" if p == best else ""
        print(f"  kc {p[0]:5d}, kp {p[1]}, {p[2]} tiles: {times[p] / times[derived]:.3f}x{mark}")
    key = machine_key(isa, caches)
    if args.dry_run:
        return 0
    if best == derived:
        if key in stored:
            del stored[key]
            write_plans(path, stored)
        print(f"the derived plan stays (no candidate >= {1 - MIN_GAIN:.0%} faster)")
        return 0
    stored[key] = {
        "kc": best[0],
        "kp": best[1],
        "group": best[2],
        "time_ratio": round(ratio, 4),
        "shapes": [f"{n}x{k}" for n, k in args.shapes],
        "m": list(args.m),
        "threads": threads,
    }
    write_plans(path, stored)
    print(f"stored in {path}: kc {best[0]}, kp {best[1]}, {best[2]} tiles ({ratio:.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
