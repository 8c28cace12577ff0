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
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy.typing as npt

__all__ = [
    "CACHE_ENV",
    "CHECKPOINT_DIR",
    "GOLDEN_RESOURCE",
    "MIN_PROMPTS",
    "NEW_TOKENS",
    "T6Model",
    "T6ModelUnavailable",
    "build_model",
    "cached_checkpoint",
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


#: The checkpoint's folder name inside the folder :func:`build_model` writes to.
CHECKPOINT_DIR = "smollm2-nvfp4"
#: A folder where the T6 checkpoint is kept between runs (``nox -s conformance-<hw>``
#: sets it: its T7 certificate run reuses the checkpoint its T6 run wrote).
CACHE_ENV = "NVFP4_T6_CACHE"


class T6ModelUnavailable(Exception):
    """The T6 model cannot be built here (a missing extra or model, or a model that is not
    the golden file's); the message says which and what to install."""


@dataclass
class T6Model:
    """The float32 SmolLM2 model, the NVFP4 ModelOpt checkpoint made from it, its sha256 and
    the seconds the build took."""

    fp32: Any
    checkpoint: Path
    fingerprint: str
    build_s: float


def build_model(golden: dict[str, Any], folder: Path) -> T6Model:
    """Load SmolLM2-135M-Instruct (float32), quantize it as the golden file's generator did,
    check its sha256 against ``golden`` and write it as a ModelOpt checkpoint under
    ``folder``: the model T6 decodes on one process and T7 on several ranks.

    Raises:
        T6ModelUnavailable: the ``parity`` extra or the GGUF is missing, or the model built
            is not the one the golden tokens were made from.
    """
    try:
        from nvfp4_torch import smollm2
        from nvfp4_torch.generate import missing_requirements
    except ImportError as exc:
        raise T6ModelUnavailable(f"`pip install 'nvfp4-conformance[parity]'`: {exc}") from None
    missing = missing_requirements()
    if missing:
        raise T6ModelUnavailable(
            f"`pip install 'nvfp4-conformance[parity]'`: {', '.join(missing)} missing"
        )
    t0 = time.time()
    try:
        fp32 = smollm2.load_float32_model()
    except Exception as exc:
        raise T6ModelUnavailable(
            f"SmolLM2-135M-Instruct could not be loaded: {type(exc).__name__}: {exc}"
        ) from None
    want = golden["model"]["quantized_model_sha256"]
    try:
        ckpt = smollm2.write_checked_checkpoint(
            fp32, want, folder / CHECKPOINT_DIR, source=GOLDEN_RESOURCE
        )
    except smollm2.FingerprintMismatch as exc:
        raise T6ModelUnavailable(
            f"{exc}; regenerate with conformance/scripts/make_t6_golden.py"
        ) from None
    return T6Model(fp32, ckpt, want, time.time() - t0)


def cached_checkpoint(golden: dict[str, Any], folder: Path) -> Path | None:
    """The T6 checkpoint :func:`build_model` wrote under ``folder`` (an earlier run's), or
    None when there is none or it is not the golden file's model: its planes and tensors,
    read back, must have the golden sha256 (a partial or stale folder is not used)."""
    path = folder / CHECKPOINT_DIR
    if not (path / "config.json").is_file():
        return None
    try:
        import numpy as np
        from nvfp4_checkpoints import open_checkpoint
        from nvfp4_torch import smollm2
        from nvfp4_torch.loader import AUX_SUFFIXES

        with open_checkpoint(path) as ckpt:
            planes = {p: ckpt.planes(p) for p in ckpt.quantized_names()}
            tensors = {
                n: np.asarray(ckpt.tensor(n))
                for n in ckpt.tensor_names()
                if not n.endswith(AUX_SUFFIXES)
            }
    except Exception:  # unreadable: built again
        return None
    want = golden["model"]["quantized_model_sha256"]
    return path if smollm2.planes_fingerprint(planes, tensors) == want else None
