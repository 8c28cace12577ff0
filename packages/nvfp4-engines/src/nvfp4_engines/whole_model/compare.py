"""The comparison of an engine's whole-model generation with the T6 reference tokens.

Pure numpy: :func:`compare_prompt` takes, for one golden prompt, the reference's tokens and
margins (``t6_golden.json``, of the activation mode the engine computes in), the engine's
greedy tokens with the logits each was chosen from, and both sides' logits teacher-forced
on the reference tokens; :func:`summarize` folds the prompts into the engine's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4_torch import parity

__all__ = ["VERDICTS", "compare_prompt", "summarize"]

#: ``reproduced``: every token equal; ``diverged at near ties``: every prompt that
#: diverged did so at a step whose reference margin is below the near-tie threshold (a
#: coin toss, see T6); ``diverged``: some prompt diverged where the reference's choice was
#: clear.
VERDICTS = ("reproduced", "diverged at near ties", "diverged")

Logits = npt.NDArray[Any]


def _margin(row: Logits) -> float:
    top2 = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return float(top2[1] - top2[0])


def compare_prompt(
    reference: dict[str, Any],
    engine_ids: Sequence[int],
    engine_logits: Logits,
    reference_tf: Logits,
    engine_tf: Logits,
    threshold: float,
) -> dict[str, Any]:
    """One prompt's figures.

    ``reference``: ``golden_ids`` and ``margins`` (one per step). ``engine_ids`` and
    ``engine_logits [steps, vocab]``: the engine's greedy tokens and the logits (or log
    probabilities) each was chosen from. ``reference_tf`` / ``engine_tf [steps, vocab]``:
    both sides' logits teacher-forced on the reference tokens. Token parity: the first
    divergence and the reference margin there (a near tie when below ``threshold``);
    teacher-forced: mean KL(reference || engine), how often the engine's top-1 is the
    reference token, and the largest logit difference.
    """
    golden = [int(i) for i in reference["golden_ids"]]
    ids = [int(i) for i in engine_ids]
    margins = [float(m) for m in reference["margins"]]
    steps = len(golden)
    for what, a in (("engine_tf", engine_tf), ("reference_tf", reference_tf)):
        if np.shape(a)[0] != steps:
            raise ValueError(f"{what}: {np.shape(a)[0]} steps of logits, expected {steps}")
    if len(ids) != np.shape(engine_logits)[0]:
        raise ValueError(
            f"engine_logits: {np.shape(engine_logits)[0]} steps for {len(ids)} engine tokens"
        )
    matched = parity.first_mismatch(ids, golden)
    divergence = None
    if matched < steps:
        if matched < len(ids):
            own, row = ids[matched], np.asarray(engine_logits[matched], dtype=np.float64)
            engine_side: dict[str, Any] = {
                "engine_token": own,
                "engine_margin": _margin(row),
                "engine_logit_gap": float(row[own] - row[golden[matched]]),
            }
        else:  # the engine stopped early
            engine_side = {"engine_token": None, "engine_margin": None, "engine_logit_gap": None}
        divergence = {
            "step": matched,
            "reference_token": golden[matched],
            "reference_margin": margins[matched],
            "near_tie": margins[matched] < threshold,
            **engine_side,
        }
    ref = np.asarray(reference_tf, dtype=np.float64)
    eng = np.asarray(engine_tf, dtype=np.float64)
    return {
        "name": str(reference.get("name", "?")),
        "tokens_matched": matched,
        "tokens_expected": steps,
        "divergence": divergence,
        "min_reference_margin": min(margins),
        "min_engine_margin": float(np.min(t6_margins(engine_logits))) if len(ids) else None,
        "engine_ids": ids,
        "mean_kl_reference_to_engine": parity.mean_kl(ref, eng),
        "top1_agreement": float(np.mean(np.argmax(eng, axis=-1) == np.asarray(golden))),
        "max_abs_logit_diff": float(np.abs(ref - eng).max()),
        "finite": bool(np.isfinite(eng).all() and np.isfinite(engine_logits).all()),
    }


def t6_margins(logits: Logits) -> npt.NDArray[np.float64]:
    """Top-1 minus top-2 of every row."""
    top2 = np.sort(np.asarray(logits, dtype=np.float64), axis=-1)[..., -2:]
    out: npt.NDArray[np.float64] = top2[..., 1] - top2[..., 0]
    return out


def summarize(prompts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The engine's figures over every prompt: tokens matched of expected, the verdict
    (:data:`VERDICTS`), mean KL and top-1 agreement (every step weighs the same), the
    largest teacher-forced logit difference."""
    divergences = [p["divergence"] for p in prompts if p["divergence"] is not None]
    if not divergences and all(p["finite"] for p in prompts):
        verdict = VERDICTS[0]
    elif all(d["near_tie"] for d in divergences) and all(p["finite"] for p in prompts):
        verdict = VERDICTS[1]
    else:
        verdict = VERDICTS[2]
    steps = [p["tokens_expected"] for p in prompts]
    return {
        "verdict": verdict,
        "tokens_matched": sum(p["tokens_matched"] for p in prompts),
        "tokens_expected": sum(steps),
        "prompts_reproduced": sum(p["divergence"] is None for p in prompts),
        "prompts": len(prompts),
        "mean_kl_reference_to_engine": float(
            np.average([p["mean_kl_reference_to_engine"] for p in prompts], weights=steps)
        ),
        "top1_agreement": float(np.average([p["top1_agreement"] for p in prompts], weights=steps)),
        "max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in prompts),
    }
