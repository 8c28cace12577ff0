"""T7 greedy parity (spec 1.2, "Sharding"): T6's model decoded tensor-parallel at
world sizes 2 and 3 (:data:`nvfp4_conformance.t7.PARITY_WORLDS`) must give T6's golden
tokens, every one of them (4 prompts x 40 tokens).

One spawn of 3 gloo ranks (:func:`nvfp4_torch.parallel_greedy.greedy_on_ranks`) runs both
world sizes: each rank loads T6's NVFP4 checkpoint once and, for each world size it takes
part in, cuts its shards by the shard plan (q/k/v and o by whole heads / KV groups, gate/up
and down by down_proj's K plan, the lm_head by vocabulary rows), prepares them on the
backend under test (resolved by name on the rank) and decodes every prompt with
:class:`nvfp4_torch.parallel_decoder.ParallelDecoder`: row-parallel partials in float32,
summed in float32. The golden tokens' margins are at least T6's near-tie threshold, so a
reduction order cannot flip a token; a sharding mistake (a wrong head, block or scale)
does. Every rank must choose the same tokens.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nvfp4_conformance import t6
from nvfp4_conformance.t7 import PARITY_WORLDS

try:
    GOLDEN: dict[str, Any] = t6.load_golden()
except Exception:  # T6's self-check reports it; the fixture fails below
    GOLDEN = {"prompts": []}

PROMPTS = [p["name"] for p in GOLDEN.get("prompts", [])] or ["<golden file unreadable>"]


@pytest.fixture(scope="session")
def t7_greedy(
    nvfp4_t6_checkpoint: tuple[Path, float, bool],
    nvfp4_conformance_run: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[int, Any]:
    """Every prompt decoded at every world size of :data:`PARITY_WORLDS` (one spawn)."""
    from nvfp4_torch.parallel_greedy import greedy_on_ranks
    from nvfp4_torch.ranks import distributed_available

    if not GOLDEN["prompts"]:
        pytest.fail("t6_golden.json could not be read", pytrace=False)
    if not distributed_available():
        pytest.fail("T7: this torch build has no torch.distributed (gloo)", pytrace=False)
    run = nvfp4_conformance_run
    checkpoint, checkpoint_s, reused = nvfp4_t6_checkpoint
    t0 = time.time()
    runs = greedy_on_ranks(
        checkpoint,
        run.backend_name,
        [p["prompt_ids"] for p in GOLDEN["prompts"]],
        int(GOLDEN.get("max_new_tokens", t6.NEW_TOKENS)),
        PARITY_WORLDS,
        tmp_path_factory.mktemp("t7_greedy"),
        env={"NVFP4_CPU_THREADS": "1"},  # the ranks share the machine's cores
    )
    run.extra["t7_greedy"] = {
        "spawn_seconds": round(time.time() - t0, 1),
        "checkpoint_seconds": round(checkpoint_s, 1),
        "checkpoint_reused": reused,
        "worlds": {
            str(w): {
                "load_seconds": round(r.load_seconds, 1),
                "shard_seconds": round(r.shard_seconds, 1),
                "decode_seconds": round(sum(r.decode_seconds), 1),
            }
            for w, r in runs.items()
        },
    }
    return runs


@pytest.mark.requires_capability("qmm")
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("world", PARITY_WORLDS, ids=[f"tp{w}" for w in PARITY_WORLDS])
def test_sharded_greedy_parity(
    nvfp4_record: Any, t7_greedy: dict[int, Any], world: int, prompt: str
) -> None:
    from nvfp4_torch import parity

    i, p = next((i, q) for i, q in enumerate(GOLDEN["prompts"]) if q["name"] == prompt)
    run = t7_greedy[world]
    new_ids, logits = run.new_ids[i], run.logits[i]
    golden_ids = [int(t) for t in p["golden_ids"]]
    threshold = float(GOLDEN["near_tie_threshold"])
    matched = parity.first_mismatch(new_ids, golden_ids)
    figures: dict[str, Any] = {
        "kind": "sharded_parity",
        "world": world,
        "tokens_matched": matched,
        "tokens_expected": len(golden_ids),
        "first_mismatch": None if matched == len(golden_ids) else matched,
        "ranks_agree": run.ranks_agree,
        "min_reference_margin": float(min(p["margins"])),
        "min_backend_margin": float(parity.margins(logits).min()),
        "near_tie_threshold": threshold,
        "decode_seconds": round(run.decode_seconds[i], 2),
    }
    if "top1_logits" in p:
        n = min(matched, len(p["top1_logits"]))
        if n:
            top1 = logits[np.arange(n), np.asarray(golden_ids[:n])]
            figures["max_abs_top1_logit_diff_vs_golden"] = float(
                np.abs(top1 - np.asarray(p["top1_logits"][:n])).max()
            )
    nvfp4_record(f"{prompt} TP{world}", **figures)
    assert run.ranks_agree, f"TP{world}: the ranks chose different tokens (rank 0's: {new_ids})"
    if matched < len(golden_ids):
        raise AssertionError(f"TP{world}: " + t6.mismatch_message(p, new_ids, logits, threshold))
