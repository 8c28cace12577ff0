"""Measure what float32 accumulation can reach where a matmul's sums cancel (spec draft).

Spec 1.0-1.2 bound one call's error by ``max|y - ref| / max|ref|`` and allow float32
accumulation "in any order". Those two cannot both hold where an output's sum cancels: the
error of a float32 sum is a few units of ``2^-24 * S``, where ``S = sum_k |x[m,k] * w[n,k]|``
(the decoded weights with their globals), and ``S / max|ref|`` has no bound. On the input
of :func:`nvfp4.testing.cancelling_blocks` (one output, K = 32: two blocks of +6 * 448 and
-6 * 448 times nearly equal activations) every order ``measure_tolerances.py`` measured to
set the tolerances is off by 27-29 % of ``max|ref|``, against a tolerance of 1e-4.

This script measures, for the same orders (``measure_tolerances.VARIANTS``: one float32
BLAS matmul, split-K in chunks of 16 and 256, per-block ``sum(x * e2m1) * e4m3`` added in
order; ggml's order for W4A8 int8) and for the plain sequential loop (:func:`sequential`),
on every matmul path (W4A16, and W4A4, W4A8 int8 and W4A8 FP8 with the activations
quantized by the reference, ``S`` then over the decoded activations with their global), the
error of every output element against the path's float64 reference in units of
``sqrt(K) * 2^-24 * S`` (:func:`unit`), on three corpora whose sums cancel:

* ``spread``: the plane fuzz's weights, valid but not from a quantizer: random codes, scale
  bytes drawn uniformly from 0x00-0x7E (blocks of one row up to 2^17 apart), a random
  global ``2^U(-20, 20)``; normal x;
* ``pairs``: blocks in pairs with the same scale byte and negated codes, the second
  block's activations those of the first times ``1 + 2^-U(4, 22)``: sums that cancel to
  any depth;
* ``halves``: the same with K's first half against its second, every term of the first
  half positive: the running sum of a sequential loop climbs to ``S / 2`` first (its worst
  case).

For a float16 / bfloat16 output (x given in that dtype, as the spec measures) the error is
counted after one spacing of the output dtype at ``|ref|``. An output whose ``S`` is 0 must
be exact.

It also measures row-parallel (K-sharded) ``qmm`` on the same corpora (``--row-parallel``,
fewer seeds a shape): K split over 2, 3, 4 and 8 ranks by the shard plan, each rank's
partial by every order above times its global, kept in float32, the partials summed in
float32 by every reduction ``measure_shard_tolerances.py`` measures (rank order, reverse,
a pairwise tree), then cast once to the output dtype: spec 1.2's rule, whose
``[row_parallel]`` bound has no floor in 1.3. The error is counted in units of the whole
call's ``sqrt(K) * 2^-24 * S`` (S over all of K).

It also measures, on ``measure_tolerances``' own corpus (normal and heavy-tailed data over
the T4 grid), how large ``sqrt(K) * 2^-24 * S / max|ref|`` gets, so the floor's number can
be judged against the tolerances there: a floor under ``tolerance * max|ref|`` on every
output of a call changes no verdict of that call.

Run from ``packages/nvfp4-core``::

    PYTHONPATH=src python scripts/measure_cancellation.py [--quick] [--row-parallel]
        [--json PATH] [--floor F]

It takes about seven minutes on two cores (``--quick``: 30 s; ``--row-parallel`` adds
about ten).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure_tolerances as mt
from measure_shard_tolerances import REDUCTIONS
from nvfp4 import reference as ref
from nvfp4.accumulation_floor import absolute_sums, output_spacing, unit
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import shard_plan
from nvfp4.shard_planes import shard_planes
from nvfp4.spec import E4M3_VALUES, Q8_BLOCK_SIZE, SPEC_VERSION
from nvfp4.testing import cancelling_blocks, cancelling_halves, relative_error
from nvfp4.tolerances import accumulation_floor, tolerance

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
#: (M, N) of the cancelling cases: single outputs and a few rows and columns.
SMALL_MN = ((1, 1), (1, 7), (3, 1), (3, 7))
#: Seeds a shape of the cancelling corpora: all of them, and the row-parallel measurement's
#: (four worlds times three reductions a case).
SEEDS = {"quick": 16, "full": 256, "row_parallel": 32}
#: Seeds a shape of the ``halves`` corpus (the same three uses).
HALVES_SEEDS = {"quick": 4, "full": 32, "row_parallel": 8}
#: The world sizes of the row-parallel measurement: T7's.
WORLDS = (2, 3, 4, 8)


def sequential(x: F32, w: NVFP4Planes, wv: F32) -> F32:
    """One float32 running sum per output over k = 0, 1, ..., K-1, each product
    ``x * (e2m1 * e4m3)`` rounded before it is added: the plain scalar loop (nvfp4-cpu's
    portable level adds element pairs this way). Not among ``measure_tolerances``' orders,
    and the one whose error grows most with K where a sum cancels."""
    acc = np.zeros((x.shape[0], wv.shape[0]), np.float32)
    for k in range(x.shape[1]):
        acc = (acc + (x[:, k : k + 1] * wv[:, k][None, :]).astype(np.float32)).astype(np.float32)
    return acc


#: The orders measured: ``measure_tolerances``' and the sequential loop.
ORDERS = {**mt.VARIANTS, "sequential": sequential}


def spread_cases(seeds: int) -> Iterator[tuple[str, F32, NVFP4Planes]]:
    for k in mt.K_VALUES:
        for m, n in SMALL_MN:
            for seed in range(seeds):
                rng = np.random.default_rng([k, m, n, seed, 1])
                codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
                scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
                g = np.asarray(2.0 ** rng.uniform(-20, 20), np.float32)
                w = NVFP4Planes(codes=codes, scales=scales, global_scale=g, name="spread")
                x = rng.standard_normal((m, k)).astype(np.float32)
                yield f"spread M={m} K={k} N={n} seed={seed}", x, w


def pairs_cases(seeds: int) -> Iterator[tuple[str, F32, NVFP4Planes]]:
    for k in mt.K_VALUES[1:]:  # two blocks at least
        for m, n in SMALL_MN:
            for seed in range(seeds):
                rng = np.random.default_rng([k, m, n, seed, 2])
                nb = k // 16
                half = rng.integers(0, 256, (n, nb // 2, 8), dtype=np.uint8)
                # negating a code flips its sign bit (bit 3 of each nibble)
                codes = np.stack([half, half ^ 0x88], axis=2).reshape(n, k // 2)
                s = rng.integers(0x30, 0x7F, (n, nb // 2), dtype=np.uint8)
                scales = np.repeat(s, 2, axis=1)
                w = NVFP4Planes(codes=codes, scales=scales, global_scale=mt.ONE, name="p")
                xa = rng.standard_normal((m, nb // 2, 16))
                rel = 2.0 ** -rng.uniform(4, 22, (m, nb // 2, 1))
                xb = xa * (1 + rel)
                x = np.stack([xa, xb], axis=2).reshape(m, k).astype(np.float32)
                yield f"pairs M={m} K={k} N={n} seed={seed}", x, w


def halves_cases(seeds: int) -> Iterator[tuple[str, F32, NVFP4Planes]]:
    """The worst case of the sequential loop: every term of K's first half positive, the
    second half the same terms negated on activations ``1 + 2^-U(4, 22)`` times larger, so
    the running sum climbs to ``S / 2`` and comes back down to almost nothing."""
    for k in mt.K_VALUES[1:]:
        for m, n in SMALL_MN:
            for seed in range(seeds):
                rng = np.random.default_rng([k, m, n, seed, 3])
                x, w = cancelling_halves(rng, m, n, k, name="h")
                yield f"halves M={m} K={k} N={n} seed={seed}", x, w


def cancelling_cases(run: str) -> Iterator[tuple[str, F32, NVFP4Planes]]:
    """The three corpora with the seeds of ``run`` (a key of :data:`SEEDS`)."""
    yield from spread_cases(SEEDS[run])
    yield from pairs_cases(SEEDS[run])
    yield from halves_cases(HALVES_SEEDS[run])


Worst = dict[tuple[str, str, str, str, int], tuple[float, str]]
#: The matmul paths measured; W4A8 int8 needs K % 32 == 0.
PATHS = ("qmm", "w4a4", "w4a8", "w4a8_fp8")


@dataclass(frozen=True)
class Operands:
    """What one path multiplies for activations ``x``: the activations the reference
    multiplies, without their global (``a``), that global (``ga``: 1 for W4A16 and int8,
    whose ``d`` is inside ``a``), the float64 reference and extra orders of the path."""

    a: F32
    ga: np.float32
    full: F64
    extra: dict[str, F32]


def operands(path: str, x: F32, w: NVFP4Planes) -> Operands:
    one = np.float32(1.0)
    if path == "qmm":
        return Operands(x, one, ref.qmm(x, w, out_dtype=None), {})
    if path == "w4a4":
        xp = ref.quantize_activations(x)
        ga = np.float32(xp.global_scale)
        return Operands(ref.dequantize_unscaled(xp), ga, ref.qmm_w4a4(x, w, out_dtype=None), {})
    if path == "w4a8":
        xq = ref.quantize_activations_q8(x)
        extra = {"ggml": mt.ggml_order(xq, w)}
        a = xq.decoded().astype(np.float32)
        return Operands(a, one, ref.qmm_w4a8(x, w, out_dtype=None), extra)
    xf = ref.quantize_activations_fp8(x)
    a = E4M3_VALUES[xf.codes].astype(np.float32)
    ga = np.float32(xf.input_scale)
    return Operands(a, ga, ref.qmm_w4a8_fp8(x, w, out_dtype=None), {})


def floor_units(label: str, x: F32, w: NVFP4Planes, worst: Worst) -> None:
    """Every path's and order's error per output element in units of
    ``sqrt(K) * 2^-24 * S`` (S over the activations the path multiplies), for a float32
    output, and for float16 / bfloat16 outputs after one output spacing; the largest kept
    per (path, corpus, dtype, order, K). An output whose S is 0 must be exact (else inf)."""
    corpus = label.split()[0]
    k = x.shape[1]
    wv = ref.dequantize_unscaled(w)
    g = w.row_global()
    for path in PATHS:
        if path == "w4a8" and k % Q8_BLOCK_SIZE:
            continue
        for dname, dt in OUTPUT_DTYPES.items():
            xin = x if dname == "float32" else x.astype(dt).astype(np.float32)
            ops = operands(path, xin, w)
            full = np.asarray(ops.full, np.float64)
            if not np.isfinite(full).all():
                continue
            s = absolute_sums(ops.a * ops.ga, w)
            slack = output_spacing(full, dname)
            gxw = (g * ops.ga).astype(np.float32)
            results = {name: acc(ops.a, w, wv) for name, acc in ORDERS.items()} | ops.extra
            for vname, y32 in results.items():
                y = (y32 * gxw).astype(np.float32).astype(dt)
                units = floor_units_of(y, full, s, slack, k)
                keep_worst(worst, (path, corpus, dname, vname, k), units, label)


def floor_units_of(y: npt.NDArray[Any], full: F64, s: F64, slack: F64, k: int) -> float:
    """The largest error of output ``y`` against the float64 reference ``full``, beyond one
    output spacing ``slack``, in units of ``sqrt(k) * 2^-24 * s`` (``s``: the call's
    :func:`absolute_sums`); NaN where ``y`` is not finite (not measured), inf where an
    output whose ``s`` is 0 is not exact."""
    y64 = np.asarray(y, np.float64)
    if not np.isfinite(y64).all():
        return float("nan")
    err = np.maximum(np.abs(y64 - full) - slack, 0.0)
    units = np.where(s > 0, err / np.where(s > 0, unit(k) * s, 1.0), 0.0)
    units = np.where((s == 0) & (err > 0), np.inf, units)
    return float(units.max())


#: One rank's float32 partial output, its global applied: ``(x columns of the rank in
#: float32, the rank's shard, the output dtype x was given in) -> [M, N]``.
Partial = Callable[[F32, NVFP4Planes, Any], F32]


def order_partials() -> dict[str, Partial]:
    """Every order of :data:`ORDERS` as a rank's partial: its float32 sum times the shard's
    global."""

    def partial(acc: mt.Accumulate) -> Partial:
        def run(xr: F32, shard: NVFP4Planes, _dtype: Any) -> F32:
            wv = ref.dequantize_unscaled(shard)
            return (acc(xr, shard, wv) * shard.row_global()).astype(np.float32)

        return run

    return {name: partial(acc) for name, acc in ORDERS.items()}


def backend_partials(names: list[str]) -> dict[str, Partial]:
    """Each installed backend's ``qmm`` (float32 output, x in the output dtype, as T7 gives
    it) as a rank's partial: checked against the floor, never used to set it."""
    import nvfp4

    def partial(backend: Any) -> Partial:
        def run(xr: F32, shard: NVFP4Planes, dtype: Any) -> F32:
            y = backend.qmm(
                backend.from_numpy(xr.astype(dtype)), backend.prepare(shard), out_dtype="float32"
            )
            return np.asarray(backend.to_numpy(y), np.float32)

        return run

    return {f"backend {name}": partial(nvfp4.get_backend(name)) for name in names}


def row_parallel_units(
    label: str, x: F32, w: NVFP4Planes, worst: Worst, partials: dict[str, Partial]
) -> None:
    """Row-parallel ``qmm`` at every world of :data:`WORLDS` that has a block a rank: each
    rank's x columns (zero past its shard's end, as padding) times its shard by every one
    of ``partials``, in float32; the partials summed in float32 by every reduction, cast
    once to the output dtype; the error in units of the whole call's
    ``sqrt(K) * 2^-24 * S``. Kept per (``row_parallel TP<world>``, corpus, dtype,
    ``partial+reduction``, K)."""
    corpus = label.split()[0]
    k = x.shape[1]
    for world in WORLDS:
        if k // 16 < world:
            continue
        plan = shard_plan(k, world, dim="k")
        shards = [shard_planes(w, plan, r) for r in range(world)]
        for dname, dt in OUTPUT_DTYPES.items():
            xin = x if dname == "float32" else x.astype(dt).astype(np.float32)
            full = np.asarray(ref.qmm(xin, w, out_dtype=None), np.float64)
            if not np.isfinite(full).all():
                continue
            s = absolute_sums(xin, w)
            slack = output_spacing(full, dname)
            ranks = []
            for shard, r in zip(shards, plan, strict=True):
                xr = np.zeros((x.shape[0], r.padded), np.float32)
                xr[:, : r.size] = xin[:, r.start : r.stop]
                ranks.append((xr, shard))
            for pname, partial in partials.items():
                parts = [partial(xr, shard, dt) for xr, shard in ranks]
                for rname, reduce in REDUCTIONS.items():
                    y = reduce(list(parts)).astype(dt)
                    key = (f"row_parallel TP{world}", corpus, dname, f"{pname}+{rname}", k)
                    keep_worst(worst, key, floor_units_of(y, full, s, slack, k), label)


def keep_worst(worst: Worst, key: tuple[str, str, str, str, int], units: float, label: str) -> None:
    """Keep ``units`` under ``key`` when it is the largest seen (NaN: not measured)."""
    if units == units and (key not in worst or units > worst[key][0]):
        worst[key] = (units, label)


def corpus_ratios(quick: bool) -> list[tuple[str, int, int, float]]:
    """Over measure_tolerances' qmm corpus, each call's (label, K, number of outputs,
    ``sqrt(K) * 2^-24 * max S / max|ref|``): the floor of F units is ``F`` times that
    figure of ``max|ref|`` at most, so F times it under the tolerance changes nothing."""
    out = []
    for case in mt.qmm_cases(quick):
        full = np.asarray(ref.qmm(case.x, case.w, out_dtype=None), np.float64)
        k = case.x.shape[1]
        r = float(unit(k) * absolute_sums(case.x, case.w).max() / np.abs(full).max())
        out.append((case.label, k, full.size, r))
    return out


def order_outputs(x: F32, w: NVFP4Planes, world: int | None = None) -> dict[str, F32]:
    """Each order's float32 output of one ``qmm`` call (the global after accumulation); with
    ``world``, row-parallel over that many ranks: each rank's partial by the order, times
    its global, the partials summed in float32 in rank order."""
    if world is None:
        wv, g = ref.dequantize_unscaled(w), w.row_global()
        return {name: (acc(x, w, wv) * g).astype(np.float32) for name, acc in ORDERS.items()}
    plan = shard_plan(x.shape[1], world, dim="k")
    ranks = []
    for r in plan:
        xr = np.zeros((x.shape[0], r.padded), np.float32)
        xr[:, : r.size] = x[:, r.start : r.stop]
        ranks.append((xr, shard_planes(w, plan, r.rank)))
    in_rank_order = REDUCTIONS["rank order"]
    return {
        name: in_rank_order([partial(xr, shard, np.float32) for xr, shard in ranks])
        for name, partial in order_partials().items()
    }


def contradiction(x: F32, w: NVFP4Planes, world: int | None = None) -> dict[str, float]:
    """Each order's ``max|y - ref| / max|ref|`` on one call (:func:`order_outputs`)."""
    full = np.asarray(ref.qmm(x, w, out_dtype=None), np.float64)
    return {name: relative_error(y, full) for name, y in order_outputs(x, w, world).items()}


def print_worst(worst: Worst, title: str) -> None:
    """The largest units per (path, dtype, corpus), then per K, of ``worst``."""
    print(f"\n[{title}] max over elements of |y - ref| / (sqrt(K) * 2^-24 * S)")
    per: dict[tuple[str, str, str], tuple[float, str, str]] = {}
    for (path, corpus, dname, vname, _k), (units, label) in worst.items():
        key = (path, dname, corpus)
        if key not in per or units > per[key][0]:
            per[key] = (units, vname, label)
    for (path, dname, corpus), (units, vname, label) in sorted(per.items()):
        print(f"  {path:16s} {dname:9s} {corpus:7s} {units:7.3f}  ({vname}, {label})")
    print(f"\n[{title} by K] max over paths, corpora, dtypes and orders")
    for k in sorted({key[4] for key in worst}):
        units, label, order = max(
            (u, lab, f"{key[0]} {key[2]} {key[3]}")
            for key, (u, lab) in worst.items()
            if key[4] == k
        )
        print(f"  K={k:5d} {units:7.3f}  ({order}, {label})")


def worst_rows(worst: Worst) -> list[dict[str, Any]]:
    """``worst`` as JSON rows."""
    return [
        {"path": p, "corpus": c, "dtype": d, "variant": v, "k": k, "max_units": u, "case": label}
        for (p, c, d, v, k), (u, label) in sorted(worst.items())
    ]


def main(argv: list[str] | None = None) -> int:
    parser = mt.script_parser(__doc__, "16 seeds a shape, not 256")
    parser.add_argument(
        "--floor",
        type=float,
        help="the F whose effect on the corpus is shown (default: the newest spec's factor)",
    )
    parser.add_argument(
        "--row-parallel",
        action="store_true",
        help="also measure row-parallel qmm at 2, 3, 4 and 8 ranks (32 seeds a shape)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="with --row-parallel: also check this installed backend's qmm as each rank's "
        "partial (not used to set the factor; repeatable)",
    )
    args = parser.parse_args(argv)
    if args.floor is None:
        floor = accumulation_floor(SPEC_VERSION)
        if floor is None:
            parser.error(f"spec {SPEC_VERSION} has no accumulation floor: give --floor")
        args.floor = floor.factor
    t0 = time.perf_counter()

    x, w = cancelling_blocks()
    demo = contradiction(x, w)
    worst: Worst = {}
    count = 0
    for label, xc, wc in cancelling_cases("quick" if args.quick else "full"):
        with np.errstate(over="ignore", invalid="ignore"):  # outputs past float16: skipped
            floor_units(label, xc, wc, worst)
        count += 1
    row_worst: Worst = {}
    backend_worst: Worst = {}
    row_count = 0
    demo_tp2: dict[str, float] = {}
    if args.row_parallel:
        demo_tp2 = contradiction(x, w, world=2)
        orders, backends = order_partials(), backend_partials(args.backend)
        for label, xc, wc in cancelling_cases("quick" if args.quick else "row_parallel"):
            with np.errstate(over="ignore", invalid="ignore"):
                row_parallel_units(label, xc, wc, row_worst, orders)
                row_parallel_units(label, xc, wc, backend_worst, backends)
            row_count += 1
    ratios = corpus_ratios(args.quick)
    elapsed = time.perf_counter() - t0

    tol = tolerance("qmm", "float32")
    row_tol = tolerance("row_parallel", "float32")
    print(f"# {count} cancelling cases, {row_count} of them row-parallel, {elapsed:.1f} s")
    print(f"\n[contradiction] K = 32, one output; [qmm] float32 tolerance {tol:g}")
    for name, err in demo.items():
        print(f"  {name:13s} max|y - ref| / max|ref| = {err:.3g}")
    if demo_tp2:
        print(f"\n[contradiction, TP2] the same call row-parallel; [row_parallel] {row_tol:g}")
        for name, err in demo_tp2.items():
            print(f"  {name:13s} max|y - ref| / max|ref| = {err:.3g}")
    print_worst(worst, "floor")
    if row_worst:
        print_worst(row_worst, "row-parallel floor")
    if backend_worst:
        print_worst(backend_worst, "row-parallel floor, backends (checked, not used)")
    print(f"\n[corpus] measure_tolerances' qmm corpus ({len(ratios)} calls): F = {args.floor:g}")
    print("  K      calls  F*unit*S/max|ref| above the float32 tolerance  largest  (call)")
    for k in mt.K_VALUES:
        rows = [r for r in ratios if r[1] == k]
        above = [r for r in rows if args.floor * r[3] > tol]
        top = max(rows, key=lambda r: r[3])
        print(
            f"  {k:5d} {len(rows):6d}  {len(above):4d} ({sum(r[2] > 8 for r in above)} of them"
            f" with M * N > 8)  {args.floor * top[3] / tol:7.3f} x tol  ({top[0]})"
        )
    if args.json:
        payload = {
            "elapsed_s": elapsed,
            "cases": count,
            "row_parallel_cases": row_count,
            "contradiction": demo,
            "contradiction_tp2": demo_tp2,
            "unit": "sqrt(K) * 2^-24 * S",
            "floor_units": worst_rows(worst),
            "row_parallel_floor_units": worst_rows(row_worst),
            "row_parallel_backends_floor_units": worst_rows(backend_worst),
            "backends": args.backend,
            "floor": args.floor,
            "corpus": [
                {"case": label, "k": k, "outputs": size, "unit_s_over_max_ref": r}
                for label, k, size, r in ratios
            ],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
