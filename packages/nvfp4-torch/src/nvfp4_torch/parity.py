"""Figures that compare greedy runs of NVFP4 models: where two token sequences part, the
margin of each step, and KL divergences and top-1 agreement between logits.

numpy only: the conformance suite's tier T6, the engines' whole-model runs and ``generate``'s
tests all report these, computed once here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["activation_quality", "first_mismatch", "margins", "mean_kl", "quality_figures"]


def first_mismatch(new_ids: list[int], golden_ids: list[int]) -> int:
    """Index of the first token that differs (``len(golden_ids)`` when none does)."""
    for i, (a, b) in enumerate(zip(new_ids, golden_ids, strict=False)):
        if a != b:
            return i
    return len(golden_ids) if len(new_ids) >= len(golden_ids) else len(new_ids)


def margins(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Top-1 minus top-2 logit of every step."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]).astype(np.float32)


def _log_softmax(logits: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return out


def mean_kl(p_logits: npt.NDArray[Any], q_logits: npt.NDArray[Any]) -> float:
    """Mean over steps of KL(p || q) in nats, p and q the softmaxes of the logits."""
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


def quality_figures(
    float32_logits: npt.NDArray[Any], nvfp4_logits: npt.NDArray[Any], nvfp4_ids: list[int]
) -> dict[str, float]:
    """Quality of the NVFP4 model against the unquantized float32 model over the same
    steps (both teacher-forced on the NVFP4 tokens): how often the float32 model's top-1
    is the NVFP4 token, and the mean KL(float32 || NVFP4)."""
    top1 = np.argmax(np.asarray(float32_logits), axis=-1)
    agree = float(np.mean(top1 == np.asarray(nvfp4_ids)))
    return {
        "top1_agreement_vs_float32": agree,
        "mean_kl_float32_to_nvfp4": mean_kl(float32_logits, nvfp4_logits),
    }


def activation_quality(
    w4a16_logits: npt.NDArray[Any],
    float32_logits: npt.NDArray[Any],
    mode_logits: npt.NDArray[Any],
) -> dict[str, float]:
    """Quality of a quantized-activation model (W4A4, W4A8) over the same teacher-forced
    steps: mean KL(W4A16 || mode) and KL(float32 || mode) in nats, and how often its top-1
    token is W4A16's and float32's."""
    top1 = np.argmax(np.asarray(mode_logits), axis=-1)
    return {
        "mean_kl_w4a16_to_mode": mean_kl(w4a16_logits, mode_logits),
        "top1_agreement_vs_w4a16": float(np.mean(top1 == np.argmax(w4a16_logits, axis=-1))),
        "mean_kl_float32_to_mode": mean_kl(float32_logits, mode_logits),
        "top1_agreement_vs_float32": float(np.mean(top1 == np.argmax(float32_logits, axis=-1))),
    }
