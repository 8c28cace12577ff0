"""Load time of NVFP4 weights into MLX: the direct transcode against the dense path, side by
side with a plain memcpy of the same bytes, in one process.

Arms, for each source:

* ``memcpy``  - ``np.copyto`` of the codes and scale bytes into preallocated buffers: the
                floor for anything that moves these bytes once (the bars' baseline);
* ``copy``    - ``ndarray.copy()`` of the same bytes: a memcpy into freshly allocated memory
                (allocation and first-touch page faults included), what any load pays;
* ``mx.array``- ``mx.array`` of the code bytes viewed as uint32 and of the scale bytes,
                nothing else: the least it costs to get these bytes into MLX;
* ``direct``  - :func:`nvfp4_metal.transcode.transcode`: validate (content), view the code
                bytes as uint32 words, copy codes and scales into ``mx.array``, keep the
                global as a sidecar;
* ``dense``   - :func:`nvfp4_metal.transcode.requantize_dense`: decode to float16
                (``mx.dequantize`` with MLX's global), then ``mx.quantize(mode="nvfp4",
                global_scale=amax)``, the path engines take today.

Sources: one 14336 x 4096 ModelOpt triplet (``weight`` / ``weight_scale`` /
``weight_scale_2``, a Gaussian weight with log-normal row scales quantized by the reference
encoder, written with ``write_checkpoint`` and read back through ``open_checkpoint``: the arms
start from the same memory-mapped planes, page cache warm), and every NVFP4 tensor of the
SmolLM2-135M NVFP4 checkpoint (``metal_common.smollm2_checkpoint``); for that checkpoint the
whole ``nvfp4_metal.load`` (model built, every tensor loaded) is also timed both ways.

Figures: best wall time of ``--reps`` calls (dense: of ``--dense-reps``); peak memory of one
call = MLX's allocator peak + the peak of Python-side (numpy) allocations (tracemalloc).
Bars: direct >= 100x faster than dense, direct <= 2x memcpy, direct peak <= 1.5x the planes'
bytes.

    python benchmarks/metal_load.py [--workdir DIR] [--reps 7] [--dense-reps 2] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metal_common as mc
from plotting import pyplot

N, K = 14336, 4096
PREFIX = "model.layers.0.mlp.gate_proj"


def triplet_checkpoint(workdir: Path, n: int, k: int) -> Path:
    """A one-tensor ModelOpt checkpoint (built once, reused)."""
    dst = workdir / f"triplet-{n}x{k}"
    if (dst / ".complete").is_file():
        return dst
    from nvfp4 import reference
    from nvfp4_checkpoints import write_checkpoint

    rng = np.random.default_rng(4)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w *= np.exp(rng.normal(0.0, 0.5, size=(n, 1))).astype(np.float32) * np.float32(0.02)
    planes = reference.quantize(w, name=PREFIX)
    del w
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    write_checkpoint(dst, {PREFIX: planes}, flavour="modelopt", config=config, force=True)
    (dst / ".complete").write_text("ok\n")
    return dst


def measure(planes_list: list[Any], reps: int, dense_reps: int) -> dict[str, Any]:
    """The three arms over a list of planes (a tensor at a time, results kept alive)."""
    import mlx.core as mx
    from nvfp4_metal.transcode import requantize_dense, transcode

    planes_bytes = sum(p.codes.nbytes + p.scales.nbytes for p in planes_list)
    bufs = [(np.empty_like(p.codes), np.empty_like(p.scales)) for p in planes_list]

    def memcpy() -> None:
        for p, (c, s) in zip(planes_list, bufs, strict=True):
            np.copyto(c, p.codes)
            np.copyto(s, p.scales)

    def direct() -> list[Any]:
        out = [transcode(p) for p in planes_list]
        mx.eval(*[a for w in out for a in (w.weight, w.scales, w.row_global)])
        return out

    def dense() -> list[Any]:
        out = [requantize_dense(p) for p in planes_list]
        mx.eval(*[a for w in out for a in (w.weight, w.scales, w.row_global)])
        return out

    def alloc_copy() -> list[Any]:
        return [(p.codes.copy(), p.scales.copy()) for p in planes_list]

    def bare_mx() -> list[Any]:
        out = [(mx.array(p.codes.view(np.uint32)), mx.array(p.scales)) for p in planes_list]
        mx.eval(*[a for pair in out for a in pair])
        return out

    arms = {"memcpy": memcpy, "copy": alloc_copy, "mx.array": bare_mx, "direct": direct}
    for fn in arms.values():  # fault buffers in, warm MLX's allocator and the page cache
        fn()
    seconds, every = {}, {}
    for label, fn in arms.items():
        seconds[label], every[label] = mc.best_of(fn, reps)
    seconds["dense"], every["dense"] = mc.best_of(dense, dense_reps)
    mem = {}
    for label, fn in (("memcpy", alloc_copy), ("direct", direct), ("dense", dense)):
        mlx_peak, py_peak = mc.peak_bytes(fn)
        mem[label] = {"mlx_peak": mlx_peak, "numpy_peak": py_peak, "total": mlx_peak + py_peak}
    return {
        "tensors": len(planes_list),
        "planes_bytes": planes_bytes,
        "seconds": seconds,
        "all_seconds": every,
        "gb_per_s": {k: planes_bytes / v / 1e9 for k, v in seconds.items()},
        "peak_bytes": mem,
        "ratios": {
            "dense_over_direct": seconds["dense"] / seconds["direct"],
            "direct_over_memcpy": seconds["direct"] / seconds["memcpy"],
            "direct_over_copy": seconds["direct"] / seconds["copy"],
            "direct_over_mx_array": seconds["direct"] / seconds["mx.array"],
            "direct_peak_over_planes": mem["direct"]["total"] / planes_bytes,
            "dense_peak_over_planes": mem["dense"]["total"] / planes_bytes,
        },
    }


def bars(r: dict[str, Any]) -> dict[str, bool]:
    q = r["ratios"]
    return {
        "direct >= 100x faster than dense": q["dense_over_direct"] >= 100,
        "direct <= 2x memcpy": q["direct_over_memcpy"] <= 2,
        "direct peak <= 1.5x planes bytes": q["direct_peak_over_planes"] <= 1.5,
    }


def whole_load(path: Path) -> dict[str, Any]:
    """``nvfp4_metal.load`` end to end, direct then dense (one call each, after a warm-up
    that imports mlx-lm and reads the file once)."""
    import mlx.core as mx
    import nvfp4_metal

    nvfp4_metal.load(path, tokenizer=False)
    out = {}
    for transcode in ("direct", "dense"):
        mx.clear_cache()
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        model, _ = nvfp4_metal.load(path, transcode=transcode, tokenizer=False)
        dt = time.perf_counter() - t0
        out[transcode] = {"seconds": dt, "mlx_peak": int(mx.get_peak_memory())}
        del model
    out["dense_over_direct"] = out["dense"]["seconds"] / out["direct"]["seconds"]
    return out


def report(data: dict[str, Any]) -> str:
    lines = [
        "# nvfp4-metal: loading NVFP4 weights into MLX, direct transcode vs the dense path",
        "",
        f"Produced by `benchmarks/metal_load.py` (raw figures: `benchmarks/results/{data['name']}.json`) "
        f"on {data['machine']['date']}; run time {data['run_s']:.0f} s.",
        "",
        *mc.machine_lines(data["machine"]),
        "- arms: `memcpy` = `np.copyto` of the same codes and scale bytes into preallocated "
        "buffers; `direct` = `nvfp4_metal.transcode.transcode` (content validation, uint32 view, "
        "one copy into MLX, global sidecar); `dense` = decode to float16 with `mx.dequantize`, "
        'then `mx.quantize(mode="nvfp4", global_scale=amax)` '
        "(`nvfp4_metal.transcode.requantize_dense`)",
        f"- times: best of {data['reps']} calls (dense: best of {data['dense_reps']}); all arms "
        "start from the same memory-mapped planes with the page cache warm",
        "- peak memory: MLX allocator peak + peak of numpy allocations (tracemalloc) during one "
        "call; mapped checkpoint pages are not counted (every arm reads the same ones); the "
        "memcpy row's peak is that of `copy` (a copy into fresh memory)",
        "- extra arms: `copy` = `ndarray.copy()` (a memcpy into freshly allocated memory, page "
        "faults included); `mx.array` = bare `mx.array` of the same bytes (the least any MLX "
        "loader pays)",
        "",
        "## Bars",
        "",
        "| source | direct vs dense | direct / memcpy | direct peak / planes bytes | all met | direct / copy | direct / mx.array |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for key, r in data["sources"].items():
        q, b = r["ratios"], r["bars"]
        lines.append(
            f"| {r['label']} | **{q['dense_over_direct']:.0f}x** faster "
            f"({'yes' if b['direct >= 100x faster than dense'] else 'NO'}) | "
            f"{q['direct_over_memcpy']:.2f} ({'yes' if b['direct <= 2x memcpy'] else 'NO'}) | "
            f"{q['direct_peak_over_planes']:.2f} "
            f"({'yes' if b['direct peak <= 1.5x planes bytes'] else 'NO'}) | "
            f"**{'yes' if all(b.values()) else 'no'}** | {q['direct_over_copy']:.2f} | "
            f"{q['direct_over_mx_array']:.2f} |"
        )
        del key
    lines += [
        "",
        "## Figures",
        "",
        "| source | tensors | planes MB | arm | best ms | GB/s of planes | peak MB (MLX + numpy) | peak / planes |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in data["sources"].values():
        mb = r["planes_bytes"] / 1e6
        for arm in ("memcpy", "copy", "mx.array", "direct", "dense"):
            t = r["seconds"][arm]
            pk = r["peak_bytes"].get(arm)
            peak = (
                f"{pk['total'] / 1e6:.1f} ({pk['mlx_peak'] / 1e6:.1f} + "
                f"{pk['numpy_peak'] / 1e6:.1f}) | {pk['total'] / r['planes_bytes']:.2f}"
                if pk
                else "- | -"
            )
            lines.append(
                f"| {r['label']} | {r['tensors']} | {mb:.1f} | {arm} | {t * 1e3:.3g} | "
                f"{r['planes_bytes'] / t / 1e9:.2f} | {peak} |"
            )
    wl = data.get("whole_load")
    if wl:
        lines += [
            "",
            "## `nvfp4_metal.load` of the whole SmolLM2-135M NVFP4 checkpoint",
            "",
            "Model built from `config.json`, every tensor read, NVFP4 modules swapped in (one call "
            "each, after a warm-up load):",
            "",
            "| transcode | seconds | MLX peak MB |",
            "|---|---:|---:|",
            f"| direct | {wl['direct']['seconds']:.2f} | {wl['direct']['mlx_peak'] / 1e6:.0f} |",
            f"| dense | {wl['dense']['seconds']:.2f} | {wl['dense']['mlx_peak'] / 1e6:.0f} |",
            "",
            f"The dense path makes the whole load {wl['dense_over_direct']:.1f}x slower (the rest "
            "of the load - building the model, the float32 embeddings and norms, the tokenizer-free "
            "mlx-lm set-up - is common to both).",
        ]
    lines += ["", f"![load times and peak memory]({data['name']}.png)", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any]) -> None:
    if (plt := pyplot()) is None:
        print("matplotlib not installed: no plot")
        return
    sources = list(data["sources"].values())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = ("memcpy", "direct", "dense")
    colors = {"memcpy": "#999999", "direct": "#2b8cbe", "dense": "#e34a33"}
    width = 0.25
    for i, arm in enumerate(arms):
        xs = [j + (i - 1) * width for j in range(len(sources))]
        axes[0].bar(
            xs, [s["seconds"][arm] * 1e3 for s in sources], width, label=arm, color=colors[arm]
        )
        axes[1].bar(
            xs,
            [s["peak_bytes"][arm]["total"] / s["planes_bytes"] for s in sources],
            width,
            label=arm,
            color=colors[arm],
        )
    for ax in axes:
        ax.set_xticks(range(len(sources)))
        ax.set_xticklabels([s["label"] for s in sources], fontsize=8)
        ax.legend()
    axes[0].set_yscale("log")
    axes[0].set_ylabel("wall time, ms (log)")
    axes[0].set_title("load into MLX: best wall time")
    axes[1].axhline(1.5, color="k", lw=0.8, ls="--")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("peak memory / planes bytes (log)")
    axes[1].set_title("peak memory (MLX + numpy); bar at 1.5x")
    fig.tight_layout()
    fig.savefig(mc.DOCS / f"{data['name']}.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=mc.DEFAULT_WORKDIR)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dense-reps", type=int, default=2)
    ap.add_argument(
        "--quick", action="store_true", help="small triplet, no checkpoint (smoke test)"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    from nvfp4_checkpoints import open_checkpoint

    name = "metal_load_quick" if args.quick else "metal_load"
    n, k = (1024, 512) if args.quick else (N, K)
    sources: dict[str, Any] = {}
    with open_checkpoint(triplet_checkpoint(args.workdir, n, k)) as ckpt:
        planes = [ckpt.planes(PREFIX)]
        r = measure(planes, args.reps, args.dense_reps)
        r["label"] = f"{n} x {k} ModelOpt triplet"
        sources["triplet"] = r
        print(f"triplet: {r['seconds']} ratios {r['ratios']}", flush=True)
    whole = None
    if not args.quick:
        path = mc.smollm2_checkpoint(args.workdir)
        with open_checkpoint(path) as ckpt:
            planes = [ckpt.planes(p) for p in ckpt.quantized_names()]
            r = measure(planes, args.reps, args.dense_reps)
            r["label"] = "SmolLM2-135M NVFP4 (every tensor)"
            sources["checkpoint"] = r
            print(f"checkpoint: {r['seconds']} ratios {r['ratios']}", flush=True)
        whole = whole_load(path)
        print(f"whole load: {whole}", flush=True)
    for r in sources.values():
        r["bars"] = bars(r)
    data = {
        "name": name,
        "machine": mc.machine(),
        "reps": args.reps,
        "dense_reps": args.dense_reps,
        "sources": sources,
        "whole_load": whole,
        "all_bars_met": all(all(r["bars"].values()) for r in sources.values()),
    }
    mc.publish(data, report, t0, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
