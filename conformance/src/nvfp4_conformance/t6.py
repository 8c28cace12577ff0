"""T6 greedy parity: the golden file, its self-check, and the quality figures.

``data/t6_golden.json`` (written by ``conformance/scripts/make_t6_golden.py``) holds, for
SmolLM2-135M-Instruct quantized as :mod:`nvfp4_torch.smollm2` describes:

* the model's provenance and the sha256 of the quantized model (every plane and tensor);
* ``near_tie_threshold`` and how it was derived (the largest logit change measured between
  the reference backend and a float32-accumulating matmul, and the safety factor);
* at least four prompts: token ids, the reference backend's 40 greedy tokens and the
  top-1/top-2 logit margin of every step;
* per prompt, ``activation_modes.<mode>`` (spec 1.1's ``w4a8``): the reference backend's 40
  greedy tokens and margins with every NVFP4 linear computing in that activation mode, for
  engines whose matmul does (ggml's is W4A8). Those prompts were chosen for W4A16, so a
  mode's steps below the threshold are counted (``near_tie_steps``), not refused.

A backend must reproduce every token; :func:`check_golden` fails the fixture itself when
a step's margin is a near tie, since parity there would be a coin toss. The figures that
compare two runs (token parity, margins, KL) are :mod:`nvfp4_torch.parity`'s.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import numpy.typing as npt

__all__ = [
    "GOLDEN_RESOURCE",
    "MIN_PROMPTS",
    "NEW_TOKENS",
    "check_golden",
    "load_golden",
    "mismatch_message",
]

#: The golden file inside the package.
GOLDEN_RESOURCE = "t6_golden.json"
#: Prompts a golden file needs at least, and the greedy steps of each.
MIN_PROMPTS = 4
NEW_TOKENS = 40


def load_golden() -> dict[str, Any]:
    """The committed golden file shipped inside the package."""
    text = resources.files("nvfp4_conformance").joinpath("data", GOLDEN_RESOURCE).read_text("utf-8")
    golden: dict[str, Any] = json.loads(text)
    return golden


def check_golden(golden: dict[str, Any]) -> list[str]:
    """Everything wrong with a golden file (empty when it is usable): too few prompts or
    tokens, a threshold below what was measured, or a step whose margin is a near tie."""
    problems = []
    prompts = golden.get("prompts", [])
    threshold = float(golden.get("near_tie_threshold", 0.0))
    basis = golden.get("threshold_basis", {})
    measured = float(basis.get("max_abs_logit_change", float("inf")))
    if len(prompts) < MIN_PROMPTS:
        problems.append(f"{len(prompts)} prompts, at least {MIN_PROMPTS} required")
    if not threshold > 0:
        problems.append(f"near_tie_threshold {threshold!r} must be > 0")
    # a margin m survives any perturbation of the logits smaller than m / 2 everywhere
    if not threshold >= 2.0 * measured:
        problems.append(
            f"near_tie_threshold {threshold} is below twice the measured logit change {measured}"
        )
    for p in prompts:
        name = p.get("name", "?")
        ids, margins = p.get("golden_ids", []), p.get("margins", [])
        if len(ids) != golden.get("max_new_tokens", NEW_TOKENS) or len(ids) < NEW_TOKENS:
            problems.append(f"prompt {name}: {len(ids)} golden tokens, {NEW_TOKENS} required")
        if len(margins) != len(ids):
            problems.append(f"prompt {name}: {len(margins)} margins for {len(ids)} tokens")
        if not p.get("prompt_ids"):
            problems.append(f"prompt {name}: no prompt token ids")
        for step, m in enumerate(margins):
            if not float(m) >= threshold:
                problems.append(
                    f"prompt {name} step {step}: margin {m} < near-tie threshold {threshold} "
                    f"(token {ids[step] if step < len(ids) else '?'})"
                )
        for mode, entry in p.get("activation_modes", {}).items():
            mode_ids, mode_margins = entry.get("golden_ids", []), entry.get("margins", [])
            if len(mode_ids) != len(ids) or len(mode_margins) != len(mode_ids):
                problems.append(
                    f"prompt {name} {mode}: {len(mode_ids)} tokens and {len(mode_margins)} "
                    f"margins, {len(ids)} of each required"
                )
    return problems


def mismatch_message(
    prompt: dict[str, Any], new_ids: list[int], logits: npt.NDArray[Any], threshold: float
) -> str:
    """What a failed parity check says: prompt, position, both tokens, the reference's
    margin there and the backend's logits of both tokens."""
    from nvfp4_torch.parity import first_mismatch

    golden = [int(i) for i in prompt["golden_ids"]]
    pos = first_mismatch(new_ids, golden)
    ours = new_ids[pos] if pos < len(new_ids) else None
    detail = ""
    if ours is not None and pos < len(logits):
        detail = (
            f"; this backend's logits there: golden token {float(logits[pos, golden[pos]]):.4f}, "
            f"its token {float(logits[pos, ours]):.4f}"
        )
    return (
        f"T6 prompt {prompt['name']!r}: token {pos} of {len(golden)} is {ours}, the reference's "
        f"is {golden[pos]} (reference margin there {float(prompt['margins'][pos]):.4f}, near-tie "
        f"threshold {threshold}{detail}). Reference continuation: "
        f"{prompt.get('golden_text', '')!r}"
    )
