"""What the whole-model engine tests check (test_whole_model_llama_cpp.py and
test_whole_model_mlx_lm.py import it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvfp4_engines.whole_model import results
from nvfp4_engines.whole_model.run import run_engine

REPORTS = Path(__file__).resolve().parents[3] / "reports" / "engines" / results.FOLDER


def _step(divergence: dict[str, Any] | None) -> int | None:
    return None if divergence is None else int(divergence["step"])


def check_against_committed(engine: str, workdir: Path) -> None:
    """Run ``engine`` end to end and require a valid document whose tokens, first
    divergences, top-1 agreement and verdict are the committed ones (the engine's
    arithmetic is deterministic at a fixed thread count; a changed engine release or a
    changed conversion shows up here), its logits finite."""
    doc = run_engine(engine, workdir)
    results.validate(doc, engine)
    committed = json.loads((REPORTS / f"{engine}.json").read_text(encoding="utf-8"))
    assert all(p["finite"] for p in doc["prompts"]), f"{engine}: non-finite logits"
    for got, want in zip(doc["prompts"], committed["prompts"], strict=True):
        assert got["name"] == want["name"]
        assert got["engine_ids"] == want["engine_ids"], (
            f"{engine}, prompt {got['name']!r}: tokens {got['engine_ids']}, the committed "
            f"results have {want['engine_ids']} (re-run python -m nvfp4_engines.whole_model "
            f"{engine} and review)"
        )
        assert _step(got["divergence"]) == _step(want["divergence"])
        assert got["top1_agreement"] == want["top1_agreement"]
    assert doc["summary"]["verdict"] == committed["summary"]["verdict"]
    assert doc["summary"]["tokens_matched"] == committed["summary"]["tokens_matched"]
