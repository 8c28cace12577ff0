"""The whole-model comparison (nvfp4_engines.whole_model) on synthetic logits, where the
answer is known: an engine equal to the reference reproduces it, a perturbed one is
reported as divergent at the perturbed step with the reference margin there; and the
results documents, their schema and the committed ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4_conformance import T6_NEW_TOKENS, load_t6_golden
from nvfp4_engines.whole_model import results
from nvfp4_engines.whole_model.compare import VERDICTS, compare_prompt, summarize
from nvfp4_engines.whole_model.engines import ENGINES
from nvfp4_engines.whole_model.run import golden_reference

ROOT = Path(__file__).resolve().parents[3]
REPORTS = ROOT / "reports" / "engines" / results.FOLDER
STEPS, VOCAB, THRESHOLD = 40, 64, 0.05


def _reference(seed: int = 0, tie_step: int | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Golden tokens and margins from random logits (a margin of at least 1 at every step,
    or 0.01 at ``tie_step``), and those logits."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((STEPS, VOCAB)).astype(np.float32)
    ids = rng.integers(0, VOCAB, STEPS)
    for s, i in enumerate(ids):
        second = np.sort(np.delete(logits[s], i))[-1]
        logits[s, i] = second + (0.01 if s == tie_step else 1.0 + s / 10)
    m = np.sort(logits, axis=-1)
    margins = (m[:, -1] - m[:, -2]).tolist()
    return {"name": f"p{seed}", "golden_ids": ids.tolist(), "margins": margins}, logits


def _engine(logits: np.ndarray, flip: int | None = None) -> tuple[list[int], np.ndarray]:
    """Greedy tokens of ``logits`` after making another token the top-1 at step ``flip``
    (and, as greedy decoding goes on with its own token, a changed future)."""
    out = logits.copy()
    if flip is not None:
        own = int(np.argmax(out[flip]))
        other = (own + 1) % VOCAB
        out[flip, other] = out[flip, own] + 0.5
        out[flip + 1 :] = np.roll(out[flip + 1 :], 3, axis=-1)
    return [int(i) for i in np.argmax(out, axis=-1)], out


def test_an_engine_equal_to_the_reference_reproduces_it() -> None:
    ref, logits = _reference()
    ids, eng = _engine(logits)
    row = compare_prompt(ref, ids, eng, logits, logits, THRESHOLD)
    assert row["tokens_matched"] == STEPS
    assert row["divergence"] is None
    assert row["mean_kl_reference_to_engine"] == pytest.approx(0.0, abs=1e-12)
    assert row["top1_agreement"] == 1.0
    assert row["max_abs_logit_diff"] == 0.0
    assert summarize([row])["verdict"] == "reproduced"


def test_a_perturbed_engine_is_reported_divergent() -> None:
    ref, logits = _reference()
    ids, eng = _engine(logits, flip=7)
    # teacher-forced on the reference tokens, the perturbed step is the only one that differs
    tf = logits.copy()
    tf[7] = eng[7]
    row = compare_prompt(ref, ids, eng, logits, tf, THRESHOLD)
    d = row["divergence"]
    assert row["tokens_matched"] == 7
    assert d["step"] == 7
    assert d["reference_token"] == ref["golden_ids"][7]
    assert d["reference_margin"] == pytest.approx(ref["margins"][7])
    assert d["near_tie"] is False
    assert d["engine_token"] == ids[7] != ref["golden_ids"][7]
    assert d["engine_logit_gap"] > 0
    assert row["top1_agreement"] == pytest.approx(39 / 40)
    assert row["mean_kl_reference_to_engine"] > 0
    s = summarize([row, compare_prompt(ref, *_engine(logits), logits, logits, THRESHOLD)])
    assert s["verdict"] == "diverged"
    assert (s["tokens_matched"], s["tokens_expected"], s["prompts_reproduced"]) == (47, 80, 1)
    assert s["top1_agreement"] == pytest.approx(79 / 80)


def test_a_divergence_at_a_near_tie_is_told_apart() -> None:
    ref, logits = _reference(seed=3, tie_step=12)
    ids, eng = _engine(logits, flip=12)
    row = compare_prompt(ref, ids, eng, logits, logits, THRESHOLD)
    assert row["divergence"]["step"] == 12
    assert row["divergence"]["near_tie"] is True
    assert row["divergence"]["reference_margin"] < THRESHOLD
    assert summarize([row])["verdict"] == "diverged at near ties"
    clear_ref, clear_logits = _reference(seed=4)
    clear = compare_prompt(clear_ref, *_engine(clear_logits, flip=3), clear_logits, clear_logits, 1)
    assert summarize([row, clear])["verdict"] == "diverged"


def test_non_finite_logits_are_divergent_even_with_equal_tokens() -> None:
    ref, logits = _reference()
    ids, eng = _engine(logits)
    tf = logits.copy()
    tf[5, 9] = np.nan
    row = compare_prompt(ref, ids, eng, logits, tf, THRESHOLD)
    assert row["finite"] is False
    assert row["divergence"] is None
    assert summarize([row])["verdict"] == "diverged"


def test_shape_mismatches_are_refused() -> None:
    ref, logits = _reference()
    ids, eng = _engine(logits)
    with pytest.raises(ValueError, match="engine_tf: 39 steps of logits, expected 40"):
        compare_prompt(ref, ids, eng, logits, logits[:39], THRESHOLD)
    with pytest.raises(ValueError, match="engine_logits: 40 steps for 39 engine tokens"):
        compare_prompt(ref, ids[:39], eng, logits, logits, THRESHOLD)


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        r["engine_text"] = "text"
    return {
        "format": results.FORMAT,
        "engine": "toy",
        "adapter": "ggml",
        "release": "toy 1.0",
        "versions": {"toy": "1.0"},
        "settings": "none",
        "checkpoint": {
            "model": "m",
            "quantized_model_sha256": "0" * 64,
            "converted_to": "gguf",
        },
        "reference": {
            "backend": "reference",
            "activation_mode": "w4a8",
            "golden": "t6_golden.json",
            "near_tie_threshold": THRESHOLD,
        },
        "summary": summarize(rows),
        "prompts": rows,
        "timings_s": {"total": 1.5},
        "platform": {"machine": "x86_64", "cpu": None, "python": "3.11"},
    }


def test_results_schema_and_consistency(tmp_path: Path) -> None:
    ref, logits = _reference()
    good = _doc([compare_prompt(ref, *_engine(logits, flip=4), logits, logits, THRESHOLD)])
    path = results.write(good, tmp_path)
    assert path.name == "toy.json"
    assert results.load_all(tmp_path) == [json.loads(path.read_text())]
    bad = copy.deepcopy(good)
    bad["summary"]["tokens_matched"] += 1
    with pytest.raises(results.ResultsError, match=r"summary.tokens_matched: 5, the prompts sum"):
        results.validate(bad)
    bad = copy.deepcopy(good)
    bad["prompts"][0]["divergence"] = None
    with pytest.raises(results.ResultsError, match=r"prompts\[0\].divergence: None with 4 of 40"):
        results.validate(bad)
    bad = copy.deepcopy(good)
    del bad["summary"]["verdict"]
    bad["reference"]["activation_mode"] = "w4a2"
    with pytest.raises(results.ResultsError) as err:
        results.validate(bad, "x.json")
    assert "x.json" in str(err.value)
    assert "'verdict' is a required property" in str(err.value)
    assert "'w4a2' is not one of" in str(err.value)


def test_markdown_names_every_engine_and_its_divergences() -> None:
    ref, logits = _reference(seed=3, tie_step=12)
    doc = _doc([compare_prompt(ref, *_engine(logits, flip=12), logits, logits, THRESHOLD)])
    text = "\n".join(results.markdown([doc]))
    assert "| toy (toy 1.0) | `ggml` | gguf | W4A8 | 12 of 40 | diverged at near ties |" in text
    assert "p3 step 12 (reference margin 0.010, near tie)" in text
    # a divergence above the threshold but within twice the engine's logit difference
    ref, logits = _reference(seed=5)
    tf = logits + np.float32(0.8) * (np.arange(VOCAB) % 2)
    row = compare_prompt(ref, *_engine(logits, flip=2), logits, tf, THRESHOLD)
    text = "\n".join(results.markdown([_doc([row])]))
    assert (
        "p5 step 2 (reference margin 1.200, above the threshold, within 2 x the engine's " in text
    )
    row = compare_prompt(ref, *_engine(logits, flip=2), logits, logits, THRESHOLD)
    assert "p5 step 2 (reference margin 1.200, clear)" in "\n".join(results.markdown([_doc([row])]))
    assert results.markdown([]) == []


def test_golden_reference_of_each_engine_mode() -> None:
    golden = load_t6_golden()
    for engine in ENGINES.values():
        for p in golden["prompts"]:
            r = golden_reference(p, engine.mode)
            assert len(r["golden_ids"]) == len(r["margins"]) == T6_NEW_TOKENS
    p = {k: v for k, v in golden["prompts"][0].items() if k != "activation_modes"}
    with pytest.raises(KeyError, match=r"has no activation_modes\.w4a8"):
        golden_reference(p, "w4a8")


def test_committed_results_are_valid_and_cover_every_engine() -> None:
    docs = results.load_all(REPORTS)
    assert [d["engine"] for d in docs] == sorted(ENGINES)
    for d in docs:
        engine = ENGINES[d["engine"]]
        assert d["reference"]["activation_mode"] == engine.mode
        assert d["checkpoint"]["converted_to"] == engine.flavour
        assert d["summary"]["verdict"] in VERDICTS
