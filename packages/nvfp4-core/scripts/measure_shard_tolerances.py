"""Measure the error of row-parallel (K-sharded) NVFP4 matmuls: the ``[row_parallel]`` table
of ``spec/1.2/tolerances.toml`` (spec 1.2, section "Sharding for tensor and expert parallelism") is set
from what this script prints.

A row-parallel layer splits K over ``world`` ranks by the shard plan
(:func:`nvfp4.shard_plan.shard_plan`, whole 16-value blocks, optionally in units of 64);
each rank multiplies its x columns by its shard, applies the global, and the ranks' float32
partial outputs are summed (the all-reduce) before the cast to the output dtype. The
summation order of the all-reduce is not fixed (a ring, a tree, rank order), and each rank
may use any accumulation order a conforming ``qmm`` may. Measured, against the float64
unsharded reference ``nvfp4.reference.qmm(x, w, out_dtype=None)`` with the spec's metric
``max|y - ref| / max|ref|``:

* per-rank orders: ``f32`` (one float32 BLAS matmul), ``split16`` (float32 partial sums
  over chunks of 16 added in order), ``blockscale16`` (per block ``sum(x * e2m1) * e4m3``
  added in order) -- the functions of ``measure_tolerances.py``;
* reduction orders: rank order, reverse rank order, and a pairwise tree, all in float32;
* x in float32, and for float16 / bfloat16 outputs also x given in the output dtype (the
  reference then computed from that same x).

Informational only (not a tolerance): the ranks' partials rounded to the output dtype
before a reduction in that dtype, which the spec forbids (it is what the float32 reduction
rule prevents).

Shapes come from real NVFP4 models (the K of a row-parallel layer): 1,856 (Nemotron-3-Nano
routed expert down_proj), 2,880 (a 2,880-wide hidden size: an o_proj / down_proj K), 640
(a 640-wide MoE expert; also with 64-value units), 576 and 1,536 (SmolLM2-135M o_proj and
down_proj), 4,096 and 14,336 (Llama-3-8B hidden and MLP); world sizes 2, 3, 4, 8; M in
1, 3, 16; N in 1, 7, 64; normal and heavy-tailed data; outputs with M * N <= 8 over several
seeds.

Run from ``packages/nvfp4-core``::

    PYTHONPATH=src python scripts/measure_shard_tolerances.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

try:
    import nvfp4
except ImportError:  # run from a source checkout without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import nvfp4

# the script's folder is on sys.path when it runs: the orders of measure_tolerances.py
from measure_tolerances import block_scaled, heavy_weights, heavy_x, split_k
from nvfp4 import reference as ref
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import shard_plan
from nvfp4.shard_planes import shard_planes

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

#: (K, where it comes from, alignment in blocks).
K_SHAPES: tuple[tuple[int, str, int], ...] = (
    (1856, "Nemotron-3-Nano-30B-A3B routed expert down_proj", 1),
    (2880, "a 2,880 hidden size (o_proj / down_proj K)", 1),
    (640, "a 640-wide MoE expert down_proj", 1),
    (640, "a 640-wide MoE expert down_proj, kernel alignment 64", 4),
    (576, "SmolLM2-135M o_proj", 1),
    (1536, "SmolLM2-135M down_proj", 1),
    (4096, "Llama-3-8B o_proj", 1),
    (14336, "Llama-3-8B down_proj", 1),
)
WORLDS = (2, 3, 4, 8)
M_VALUES = (1, 3, 16)
N_VALUES = (1, 7, 64)
#: Seeds for outputs of M * N <= 8 (the metric divides by max|ref|, which cancellation
#: makes small): the worst case over seeds is what the tolerance must cover.
TINY_OUTPUT_SEEDS = 16

Accumulate = Callable[[F32, NVFP4Planes, F32], F32]
RANK_ORDERS: dict[str, Accumulate] = {
    "f32": lambda x, w, wv: np.asarray(np.matmul(x, wv.T), dtype=np.float32),
    "split16": lambda x, w, wv: split_k(x, wv, 16),
    "blockscale16": lambda x, w, wv: block_scaled(x, w),
}


def tree_sum(parts: list[F32]) -> F32:
    """Pairwise float32 sum: (p0 + p1) + (p2 + p3) ..."""
    while len(parts) > 1:
        nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def in_order(parts: list[F32]) -> F32:
    """float32 sum in the given order: ((p0 + p1) + p2) + ..."""
    acc = parts[0].copy()
    for p in parts[1:]:
        acc += p
    return acc


REDUCTIONS: dict[str, Callable[[list[F32]], F32]] = {
    "rank order": in_order,
    "reverse": lambda p: in_order(p[::-1]),
    "tree": tree_sum,
}


def rel_err(y: npt.NDArray[np.floating], r: F64) -> float:
    scale = float(np.max(np.abs(r)))
    diff = float(np.max(np.abs(y.astype(np.float64) - r)))
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def cases():
    for k, source, align in K_SHAPES:
        for world in WORLDS:
            units = -(-k // (16 * align))
            if units < world:
                continue
            for m in M_VALUES:
                for n in N_VALUES:
                    seeds = TINY_OUTPUT_SEEDS if m * n <= 8 else 1
                    for seed in range(seeds):
                        for data in ("normal", "heavy"):
                            rng = np.random.default_rng([k, world, m, n, seed, align, len(data)])
                            if data == "normal":
                                wf = rng.standard_normal((n, k)).astype(np.float32)
                                x = rng.standard_normal((m, k)).astype(np.float32)
                            else:
                                wf = heavy_weights(rng, (n, k))
                                x = heavy_x(rng, m, k)
                            label = (
                                f"{data} K={k} ({source}) TP{world} align={align} "
                                f"M={m} N={n} seed={seed}"
                            )
                            yield label, k, world, align, ref.quantize(wf), x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    worst: dict[str, tuple[float, str]] = {}
    informational: dict[str, tuple[float, str]] = {}
    count = 0

    def note(table: dict[str, tuple[float, str]], key: str, err: float, label: str) -> None:
        if key not in table or err > table[key][0]:
            table[key] = (err, label)

    for label, k, world, align, w, x32 in cases():
        count += 1
        plan = shard_plan(k, world, dim="k", align=align)
        shards = [shard_planes(w, plan, r) for r in range(world)]
        for dname, dt in OUTPUT_DTYPES.items():
            xs = (
                [("x f32", x32)]
                if dname == "float32"
                else [("x f32", x32), ("x out", x32.astype(dt).astype(np.float32))]
            )
            for xlabel, x in xs:
                reference = ref.qmm(x, w, out_dtype=None)
                cols = []
                for s, r in zip(shards, plan, strict=True):
                    xr = np.zeros((x.shape[0], r.padded), np.float32)
                    xr[:, : r.size] = x[:, r.start : r.stop]
                    cols.append((xr, s, ref.dequantize_unscaled(s), s.row_global()))
                for oname, order in RANK_ORDERS.items():
                    parts = [(order(xr, s, wv) * g).astype(np.float32) for xr, s, wv, g in cols]
                    for rname, reduce in REDUCTIONS.items():
                        y = reduce(list(parts)).astype(dt)
                        note(
                            worst, dname, rel_err(y, reference), f"{label} {xlabel} {oname} {rname}"
                        )
                    if dname != "float32":  # forbidden: partials rounded, reduced in dtype
                        acc = parts[0].astype(dt)
                        for p in parts[1:]:
                            acc = (acc + p.astype(dt)).astype(dt)
                        note(
                            informational,
                            dname,
                            rel_err(acc, reference),
                            f"{label} {xlabel} {oname}",
                        )
    elapsed = time.perf_counter() - t0
    print(f"# nvfp4 {nvfp4.__version__}, numpy {np.__version__}; {count} cases, {elapsed:.1f} s")
    print("[row_parallel]  max over cases of max|y - ref| / max|ref| (float32 all-reduce)")
    for dname, (err, label) in worst.items():
        print(f"  {dname:9s} {err:.3e}  ({label})")
    print("informational: partials rounded to the output dtype and reduced in it (forbidden)")
    for dname, (err, label) in informational.items():
        print(f"  {dname:9s} {err:.3e}  ({label})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "script": "packages/nvfp4-core/scripts/measure_shard_tolerances.py",
                    "nvfp4": nvfp4.__version__,
                    "numpy": np.__version__,
                    "cases": count,
                    "seconds": round(elapsed, 1),
                    "metric": "max|y - ref| / max|ref|",
                    "row_parallel": {d: {"max": e, "case": c} for d, (e, c) in worst.items()},
                    "informational_reduced_in_output_dtype": {
                        d: {"max": e, "case": c} for d, (e, c) in informational.items()
                    },
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
