"""The T6 golden file (``nvfp4_conformance.t6``): the committed file passes its self-check,
the self-check catches a near tie, a threshold below the measured logit change and too few
prompts or tokens, and a parity failure's message names what a reader needs.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from nvfp4_conformance import t6
from nvfp4_torch import parity


def test_committed_golden_passes_self_check() -> None:
    golden = t6.load_golden()
    assert t6.check_golden(golden) == []
    assert len(golden["prompts"]) >= t6.MIN_PROMPTS
    for p in golden["prompts"]:
        assert len(p["golden_ids"]) == t6.NEW_TOKENS == len(p["margins"])
        assert min(p["margins"]) >= golden["near_tie_threshold"]


def test_committed_golden_holds_the_w4a8_reference_tokens() -> None:
    golden = t6.load_golden()
    assert golden["activation_modes"]["w4a8"]["spec_version"] == "1.1"
    for p in golden["prompts"]:
        w4a8 = p["activation_modes"]["w4a8"]
        assert len(w4a8["golden_ids"]) == t6.NEW_TOKENS == len(w4a8["margins"])
        assert w4a8["min_margin"] == pytest.approx(min(w4a8["margins"]), abs=1e-6)
        near = [i for i, m in enumerate(w4a8["margins"]) if m < golden["near_tie_threshold"]]
        assert w4a8["near_tie_steps"] == near
        assert w4a8["first_divergence_from_w4a16"] == parity.first_mismatch(
            w4a8["golden_ids"], p["golden_ids"]
        )
    broken = copy.deepcopy(golden)
    del broken["prompts"][2]["activation_modes"]["w4a8"]["margins"][-1]
    (problem,) = t6.check_golden(broken)
    assert problem == (
        f"prompt {golden['prompts'][2]['name']} w4a8: 40 tokens and 39 margins, 40 of each required"
    )


def test_self_check_catches_a_near_tie() -> None:
    golden = copy.deepcopy(t6.load_golden())
    golden["prompts"][1]["margins"][5] = golden["near_tie_threshold"] / 2
    problems = t6.check_golden(golden)
    assert len(problems) == 1
    assert "step 5" in problems[0]
    assert golden["prompts"][1]["name"] in problems[0]


def test_self_check_catches_a_threshold_below_the_measured_change() -> None:
    golden = copy.deepcopy(t6.load_golden())
    golden["threshold_basis"]["max_abs_logit_change"] = golden["near_tie_threshold"]
    assert any("below twice the measured" in p for p in t6.check_golden(golden))


def test_self_check_catches_too_few_prompts_and_tokens() -> None:
    golden = copy.deepcopy(t6.load_golden())
    golden["prompts"] = golden["prompts"][:2]
    golden["prompts"][0]["golden_ids"] = golden["prompts"][0]["golden_ids"][:39]
    problems = t6.check_golden(golden)
    assert any("at least 4 required" in p for p in problems)
    assert any("39 golden tokens" in p for p in problems)


def test_mismatch_message_names_prompt_position_tokens_and_margin() -> None:
    golden = t6.load_golden()
    p = golden["prompts"][0]
    ids = list(p["golden_ids"])
    ids[7] = (ids[7] + 1) % 1000
    logits = np.zeros((40, 49152), dtype=np.float32)
    logits[7, ids[7]] = 3.0
    logits[7, p["golden_ids"][7]] = 2.5
    assert parity.first_mismatch(ids, p["golden_ids"]) == 7
    msg = t6.mismatch_message(p, ids, logits, golden["near_tie_threshold"])
    assert f"T6 prompt {p['name']!r}: token 7 of 40 is {ids[7]}" in msg
    assert f"the reference's is {p['golden_ids'][7]}" in msg
    assert f"reference margin there {p['margins'][7]:.4f}" in msg
    assert "golden token 2.5000, its token 3.0000" in msg
