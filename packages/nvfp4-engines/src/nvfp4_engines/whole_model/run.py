"""One engine's whole-model T6 run, from the model build to the results document.

1. Build the T6 model as the suite does (:mod:`nvfp4_torch.smollm2`), require the
   golden file's sha256, write it as a ModelOpt checkpoint with nvfp4's writer.
2. Convert it with nvfp4's converter (:func:`nvfp4_checkpoints.write_checkpoint`) to the
   engine's format (GGUF for llama.cpp, an MLX folder for mlx-lm).
3. Reference: the same checkpoint on the ``reference`` backend in the engine's activation
   mode (:func:`nvfp4_torch.decode.activation_mode`), teacher-forced on the golden tokens
   of that mode.
4. The engine: its own greedy generation for every golden prompt (the same token ids, 40
   new tokens) with every step's logits, then teacher-forced on the golden tokens.
5. :mod:`.compare` per prompt and over all; the document :mod:`.results` describes.
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from pathlib import Path
from typing import Any

from .compare import compare_prompt, summarize
from .engines import ENGINES, Engine
from .results import FORMAT

__all__ = ["build_checkpoint", "convert", "golden_reference", "run_engine"]

#: The distributions whose versions a results document records, besides the engine's.
OURS = ("nvfp4-core", "nvfp4-checkpoints", "nvfp4-conformance", "nvfp4-engines")
OTHERS = ("torch", "transformers", "numpy")


def golden_reference(prompt: dict[str, Any], mode: str) -> dict[str, Any]:
    """The reference tokens and margins of ``prompt`` in activation mode ``mode``: the
    prompt's own (``w4a16``) or its ``activation_modes[mode]`` entry."""
    if mode == "w4a16":
        src = prompt
    else:
        modes = prompt.get("activation_modes", {})
        if mode not in modes:
            raise KeyError(
                f"t6_golden.json: prompt {prompt.get('name')!r} has no activation_modes.{mode} "
                f"(found {sorted(modes)}): regenerate it with conformance/scripts/make_t6_golden.py"
            )
        src = modes[mode]
    return {"name": prompt["name"], "golden_ids": src["golden_ids"], "margins": src["margins"]}


def build_checkpoint(golden: dict[str, Any], dst: Path) -> Path:
    """The T6 model as a ModelOpt checkpoint at ``dst``; a clear error when the model built
    here is not the one the golden tokens were made from."""
    from nvfp4_conformance import T6_GOLDEN_RESOURCE
    from nvfp4_torch import smollm2

    return smollm2.write_checked_checkpoint(
        smollm2.load_float32_model(),
        golden["model"]["quantized_model_sha256"],
        dst,
        source=T6_GOLDEN_RESOURCE,
    )


def convert(checkpoint: Path, engine: Engine, workdir: Path) -> Path:
    """``checkpoint`` converted by nvfp4's converter to the engine's format."""
    from nvfp4_checkpoints import open_checkpoint, write_checkpoint

    dst = workdir / f"smollm2-nvfp4-{engine.flavour}{engine.suffix}"
    with open_checkpoint(checkpoint) as ckpt:
        return write_checkpoint(dst, ckpt, flavour=engine.flavour, force=True)


def _versions(engine: Engine) -> dict[str, str]:
    out = engine.versions()
    for dist in (*OURS, *OTHERS):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def run_engine(name: str, workdir: Path) -> dict[str, Any]:
    """The results document of engine ``name`` (a key of :data:`.engines.ENGINES`);
    ``workdir`` holds the checkpoint and its conversion."""
    import nvfp4
    from nvfp4.hardware import cpu_model
    from nvfp4_conformance import T6_GOLDEN_RESOURCE, load_t6_golden
    from nvfp4_torch import decode, loader

    if name not in ENGINES:
        raise ValueError(f"engine {name!r}: expected one of {sorted(ENGINES)}")
    engine = ENGINES[name]
    golden = load_t6_golden()
    threshold = float(golden["near_tie_threshold"])
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    ckpt = build_checkpoint(golden, workdir / "smollm2-nvfp4")
    timings["build_checkpoint"] = time.perf_counter() - t0
    t = time.perf_counter()
    converted = convert(ckpt, engine, workdir)
    timings["convert"] = time.perf_counter() - t

    t = time.perf_counter()
    refs = [golden_reference(p, engine.mode) for p in golden["prompts"]]
    model = loader.load_model(ckpt, nvfp4.get_backend("reference")).model
    ref_tf = []
    with decode.activation_mode(model, engine.mode):
        for p, r in zip(golden["prompts"], refs, strict=True):
            ref_tf.append(decode.teacher_forced_logits(model, p["prompt_ids"], r["golden_ids"]))
    del model
    timings["reference_teacher_forced"] = time.perf_counter() - t

    t = time.perf_counter()
    runner = engine.open(converted)
    timings["engine_load"] = time.perf_counter() - t
    prompts = []
    greedy_s = tf_s = 0.0
    for p, r, rtf in zip(golden["prompts"], refs, ref_tf, strict=True):
        t = time.perf_counter()
        ids, logits = runner.greedy(p["prompt_ids"], len(r["golden_ids"]))
        greedy_s += time.perf_counter() - t
        t = time.perf_counter()
        etf = runner.teacher_forced(p["prompt_ids"], r["golden_ids"])
        tf_s += time.perf_counter() - t
        row = compare_prompt(r, ids, logits, rtf, etf, threshold)
        row["engine_text"] = runner.decode(ids)
        prompts.append(row)
    timings["engine_greedy"] = greedy_s
    timings["engine_teacher_forced"] = tf_s
    timings["total"] = time.perf_counter() - t0
    return {
        "format": FORMAT,
        "engine": engine.name,
        "adapter": engine.adapter,
        "release": ", ".join(f"{k} {v}" for k, v in engine.versions().items()),
        "versions": _versions(engine),
        "settings": engine.settings,
        "checkpoint": {
            "model": golden["model"]["distribution"] + " " + golden["model"]["gguf_file"],
            "quantized_model_sha256": golden["model"]["quantized_model_sha256"],
            "converted_to": engine.flavour,
        },
        "reference": {
            "backend": "reference",
            "activation_mode": engine.mode,
            "golden": T6_GOLDEN_RESOURCE,
            "near_tie_threshold": threshold,
        },
        "summary": summarize(prompts),
        "prompts": prompts,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "platform": {
            "machine": platform.machine(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
        },
    }
