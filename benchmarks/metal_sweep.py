"""Prompt-length sweep on MLX: prefill and decode tokens/s and peak memory, native NVFP4 vs
the affine rollback, on SmolLM2-135M made NVFP4.

The SmolLM2-135M NVFP4 ModelOpt checkpoint (``metal_common.smollm2_checkpoint``) is loaded
with ``nvfp4_metal.load(path, impl=...)``:

* ``native`` - the checkpoint's NVFP4 bytes, MLX ``mode="nvfp4"`` kernels, the global as a
  sidecar (the default);
* ``affine`` - ``NVFP4_METAL_IMPL=affine``: dense decode, MLX affine 4-bit re-quantization
  (group 64, float32 scales and biases).

For each prompt length L (seeded random token ids) mlx-lm's ``generate_step`` runs a
prefill of L tokens (chunks of 2048, mlx-lm's default) then ``--decode-tokens`` greedy
steps. prefill tok/s = L / time to the first token (as mlx-lm reports it); decode tok/s =
the following tokens / their time; peak memory = MLX's allocator peak over the run, the
model's own weights included (both models stay loaded and run back to back at every length,
alternating which goes first; the other model's weights are subtracted). On a GPU the default lengths are
512 ... 16384 (capped at the model's context); on MLX's CPU device a reduced set, because
MLX's CPU matmuls run at about 2 GMAC/s on this project's machines (a 512-token prefill of
this model takes ~30 s).

    python benchmarks/metal_sweep.py [--workdir DIR] [--lengths 64,128,256,512] [--decode-tokens 16]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metal_common as mc
from plotting import pyplot

GPU_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
CPU_LENGTHS = (64, 128, 256, 512)


def run_one(model: Any, ids: list[int], decode_tokens: int) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    gen = generate_step(mx.array(ids), model, max_tokens=decode_tokens + 1)
    next(gen)
    t1 = time.perf_counter()
    n = sum(1 for _ in gen)
    t2 = time.perf_counter()
    return {
        "prompt_tokens": len(ids),
        "prefill_s": t1 - t0,
        "prefill_tok_s": len(ids) / (t1 - t0),
        "decode_tokens": n,
        "decode_s": t2 - t1,
        "decode_tok_s": n / (t2 - t1) if n else float("nan"),
        "peak_bytes": int(mx.get_peak_memory()),
    }


def sweep(path: Path, lengths: list[int], decode_tokens: int, vocab: int) -> list[dict[str, Any]]:
    """Both implementations loaded side by side; at every length the two run back to back
    (alternating which goes first), so machine drift hits both alike. A run's peak is MLX's
    peak minus the other model's weights (resident, untouched during the run)."""
    import mlx.core as mx
    import nvfp4_metal

    impls = ("native", "affine")
    models, out = {}, {}
    import mlx_lm.utils  # noqa: F401 - imported before timing either load

    with open(path / "model.safetensors", "rb") as f:  # page cache warm for both loads
        while f.read(1 << 24):
            pass
    for impl in impls:
        gc.collect()
        mx.clear_cache()
        before = int(mx.get_active_memory())
        t0 = time.perf_counter()
        models[impl], _ = nvfp4_metal.load(path, impl=impl, tokenizer=False)
        load_s = time.perf_counter() - t0
        weights = int(mx.get_active_memory()) - before
        out[impl] = {"impl": impl, "load_s": load_s, "weights_bytes": weights, "runs": []}
    rng = np.random.default_rng(2024)
    for impl in impls:  # warm-up (compiles the graphs)
        run_one(models[impl], rng.integers(0, vocab, 8).tolist(), 2)
    for i, length in enumerate(lengths):
        ids = rng.integers(0, vocab, length).tolist()
        order = impls if i % 2 == 0 else impls[::-1]
        for impl in order:
            other = next(o for o in impls if o != impl)
            r = run_one(models[impl], ids, decode_tokens)
            r["peak_bytes"] -= out[other]["weights_bytes"]
            out[impl]["runs"].append(r)
            print(
                f"{impl:>6} L={length:>6}: prefill {r['prefill_tok_s']:.1f} tok/s, "
                f"decode {r['decode_tok_s']:.2f} tok/s, peak {r['peak_bytes'] / 1e6:.0f} MB",
                flush=True,
            )
    return [out[i] for i in impls]


def report(data: dict[str, Any]) -> str:
    res = {r["impl"]: r for r in data["results"]}
    nat, aff = res["native"], res["affine"]
    lines = [
        "# nvfp4-metal: prompt-length sweep, native NVFP4 vs the affine rollback",
        "",
        f"Produced by `benchmarks/metal_sweep.py` (raw figures: `benchmarks/results/metal_sweep.json`) "
        f"on {data['machine']['date']}; run time {data['run_s']:.0f} s.",
        "",
        *mc.machine_lines(data["machine"]),
        "- model: SmolLM2-135M-Instruct made NVFP4 (every decoder linear; embeddings, norms and the "
        "tied lm_head float32), loaded with `nvfp4_metal.load(path, impl=...)`",
        "- `native`: the checkpoint's NVFP4 bytes on MLX's `nvfp4` kernels, global as a sidecar; "
        "`affine`: `NVFP4_METAL_IMPL=affine` (dense decode, MLX affine 4-bit, group 64, float32 "
        "scales/biases)",
        f"- per length: seeded random prompt, mlx-lm `generate_step` (prefill chunks of 2048), then "
        f"{data['decode_tokens']} greedy decode steps; prefill tok/s = L / time to first token; "
        "peak = MLX allocator peak over the run, the model's own weights included (both models "
        "loaded; at every length they run back to back, alternating which goes first, and the "
        "other model's resident weights are subtracted)",
        f"- lengths: {data['lengths']} ({data['lengths_note']})",
        "",
        "| L | prefill tok/s native | affine | native / affine | decode tok/s native | affine | native / affine | peak MB native | affine |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in zip(nat["runs"], aff["runs"], strict=True):
        lines.append(
            f"| {a['prompt_tokens']} | {a['prefill_tok_s']:.1f} | {b['prefill_tok_s']:.1f} | "
            f"{a['prefill_tok_s'] / b['prefill_tok_s']:.2f} | {a['decode_tok_s']:.2f} | "
            f"{b['decode_tok_s']:.2f} | {a['decode_tok_s'] / b['decode_tok_s']:.2f} | "
            f"{a['peak_bytes'] / 1e6:.0f} | {b['peak_bytes'] / 1e6:.0f} |"
        )
    lines += [
        "",
        f"Weights in memory after load: native {nat['weights_bytes'] / 1e6:.0f} MB, affine "
        f"{aff['weights_bytes'] / 1e6:.0f} MB (both include the float32 embedding, "
        f"{data['embedding_bytes'] / 1e6:.0f} MB); `nvfp4_metal.load` time native "
        f"{nat['load_s']:.2f} s, affine {aff['load_s']:.2f} s (mlx-lm imported and the file read "
        "once before either; the affine rollback decodes and re-quantizes every tensor).",
        "",
        f"![prompt-length sweep]({data['name']}.png)",
        "",
    ]
    return "\n".join(lines)


def plot(data: dict[str, Any]) -> None:
    if (plt := pyplot()) is None:
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for r in data["results"]:
        xs = [x["prompt_tokens"] for x in r["runs"]]
        style = {"native": ("#2b8cbe", "o"), "affine": ("#e34a33", "s")}[r["impl"]]
        kw = {"color": style[0], "marker": style[1], "label": r["impl"]}
        axes[0].plot(xs, [x["prefill_tok_s"] for x in r["runs"]], **kw)
        axes[1].plot(xs, [x["decode_tok_s"] for x in r["runs"]], **kw)
        axes[2].plot(xs, [x["peak_bytes"] / 1e6 for x in r["runs"]], **kw)
    titles = ("prefill tokens/s", "decode tokens/s", "peak memory, MB")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(title)
        ax.legend()
        ax.set_ylim(bottom=0)
    fig.suptitle(f"SmolLM2-135M NVFP4 on {data['machine']['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(mc.DOCS / f"{data['name']}.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=mc.DEFAULT_WORKDIR)
    ap.add_argument("--lengths", type=str, default="")
    ap.add_argument("--decode-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import json

    import mlx.core as mx

    path = mc.smollm2_checkpoint(args.workdir)
    config = json.loads((path / "config.json").read_text())
    ctx = int(config.get("max_position_embeddings", 1 << 30))
    on_gpu = mx.default_device().type == mx.gpu
    if args.lengths:
        lengths = [int(v) for v in args.lengths.split(",")]
        note = "given on the command line"
    elif on_gpu:
        lengths = [v for v in GPU_LENGTHS if v + args.decode_tokens <= ctx]
        note = f"GPU set, capped at the model's context {ctx}"
    else:
        lengths = list(CPU_LENGTHS)
        note = "reduced set for MLX's CPU device"
    vocab = int(config["vocab_size"])
    results = sweep(path, lengths, args.decode_tokens, vocab)
    data = {
        "name": "metal_sweep",
        "machine": mc.machine(),
        "lengths": lengths,
        "lengths_note": note,
        "decode_tokens": args.decode_tokens,
        "embedding_bytes": int(config["vocab_size"]) * int(config["hidden_size"]) * 4,
        "results": results,
    }
    mc.publish(data, report, t0, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
