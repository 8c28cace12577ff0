"""T7's greedy parity: T6's model tensor-parallel at 2 and 3 ranks. Collected with T7
(two world sizes x the golden prompts); its certificate section sums the tokens matched
per world size with the spawn's timings (checked here on recorded figures; the tier itself
runs in ``nox -s conformance-<hw>``'s T7 certificate, minutes on a 2-core runner)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nvfp4_conformance import t6
from nvfp4_conformance.certificate_t7 import t7_markdown, t7_section
from nvfp4_conformance.recording import ConformanceRun
from nvfp4_conformance.t7 import PARITY_WORLDS

RunTiers = Callable[..., tuple[pytest.RunResult, dict[str, Any]]]
NODE = "nvfp4_conformance/tiers/test_t7_parity.py::test_sharded_greedy_parity"


def test_naming_t7_collects_the_greedy_parity_at_every_world_and_prompt(
    run_tiers: RunTiers,
) -> None:
    result, _ = run_tiers("reference", "--collect-only", "-q", "--nvfp4-tiers=T7")
    assert result.ret == 0, result.stdout.str()[-3000:]
    out = result.stdout.str().splitlines()
    lines = [line for line in out if "test_t7_parity.py::" in line]
    prompts = [p["name"] for p in t6.load_golden()["prompts"]]
    assert len(lines) == len(PARITY_WORLDS) * len(prompts)
    assert PARITY_WORLDS == (2, 3)
    assert any(f"[tp2-{prompts[0]}]" in line for line in lines)


def _run(matched: dict[int, list[int]], agree: bool = True) -> ConformanceRun:
    run = ConformanceRun(backend_name="reference")
    for world, per_prompt in matched.items():
        for i, n in enumerate(per_prompt):
            node = f"{NODE}[tp{world}-p{i}]"
            run.outcome(node).outcome = "passed" if n == 40 and agree else "failed"
            figures = {"kind": "sharded_parity", "world": world, "tokens_matched": n}
            run.record(
                node, f"p{i} TP{world}", {**figures, "tokens_expected": 40, "ranks_agree": agree}
            )
    run.extra["t7_greedy"] = {
        "spawn_seconds": 90.5,
        "checkpoint_seconds": 3.0,
        "checkpoint_reused": True,
        "worlds": {"2": {"load_seconds": 2.0, "shard_seconds": 1.5, "decode_seconds": 40.0}},
    }
    return run


def test_the_certificate_sums_tokens_per_world_size() -> None:
    cert = t7_section(_run({2: [40, 40, 40, 40], 3: [40, 40, 12, 40]}))
    greedy = cert["t7"]["greedy_parity"]
    assert greedy["worlds"]["2"]["tokens_matched"] == 160
    assert greedy["worlds"]["3"]["tokens_matched"] == 132
    assert greedy["worlds"]["3"]["tokens_expected"] == 160
    assert greedy["worlds"]["2"]["decode_seconds"] == 40.0
    assert "decode_seconds" not in greedy["worlds"]["3"]
    assert greedy["spawn_seconds"] == 90.5
    assert greedy["checkpoint_reused"] is True
    assert cert["t7"]["tests"] == {"passed": 7, "failed": 1}
    md = "\n".join(t7_markdown(cert))
    assert "| 2 | 4 | 160/160 | yes | 2.0 | 1.5 | 40.0 |" in md
    assert "the checkpoint reused, its sha256 checked in 3.0 s" in md
    assert "| 3 | 4 | 132/160 | yes | - | - | - |" in md


def test_ranks_that_disagree_are_reported() -> None:
    cert = t7_section(_run({2: [40]}, agree=False))
    assert cert["t7"]["greedy_parity"]["worlds"]["2"]["ranks_agree"] is False
    assert "| 2 | 1 | 40/40 | no |" in "\n".join(t7_markdown(cert))


def test_without_the_greedy_parity_the_section_has_none() -> None:
    run = ConformanceRun(backend_name="reference")
    node = "nvfp4_conformance/tiers/test_t7_sharded.py::test_row_parallel_qmm[tp2-x-float32]"
    run.outcome(node).outcome = "passed"
    run.record(node, "x", {"dtype": "float32", "max_rel_err": 1e-6, "tolerance": 1e-4})
    assert "greedy_parity" not in t7_section(run)["t7"]


def test_a_cached_checkpoint_is_used_only_when_it_is_the_golden_model(tmp_path: Any) -> None:
    golden = t6.load_golden()
    assert t6.cached_checkpoint(golden, tmp_path) is None  # none there
    folder = tmp_path / t6.CHECKPOINT_DIR
    folder.mkdir()
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    assert t6.cached_checkpoint(golden, tmp_path) is None  # a partial or broken folder


def test_a_cached_checkpoint_of_another_model_is_not_used(tmp_path: Any) -> None:
    """A readable checkpoint whose planes are not the golden model's (a stale cache)."""
    pytest.importorskip("transformers")
    from nvfp4_torch import smollm2
    from nvfp4_torch.testing import tiny_model

    model = tiny_model("llama", seed=0, layers=1, vocab_size=64)
    smollm2.write_nvfp4_checkpoint(smollm2.quantize_model(model), tmp_path / t6.CHECKPOINT_DIR)
    assert (tmp_path / t6.CHECKPOINT_DIR / "config.json").is_file()
    assert t6.cached_checkpoint(t6.load_golden(), tmp_path) is None
