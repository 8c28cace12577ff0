"""The measured impact of the declared deviations: ``reports/deviation-impact.json`` covers
every deviation real checkpoints meet that the reference emulates, the registry's
``impact`` numbers are the report's, and ``docs/deviation-impact.md`` is the report's
rendering."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "deviation-impact.json"


def _tool() -> ModuleType:
    path = ROOT / "tools" / "measure_deviation_impact.py"
    spec = importlib.util.spec_from_file_location("measure_deviation_impact", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORT.read_text(encoding="utf-8"))


def test_every_real_emulated_deviation_is_measured(report: dict) -> None:
    reg = pytest.importorskip("nvfp4.deviation_registry")
    real = {d.id for d in reg.deviations() if d.scope == "real" and d.emulated}
    assert set(report["deviations"]) == real
    for ident, m in report["deviations"].items():
        assert 0 <= m["tokens"] <= m["of"] == 160, ident
    assert 0 <= report["baseline"]["forced_argmax_equal_to_generated"] <= 160
    pairs = {(r["producer"], r["consumer"]) for r in report["interchange"]}
    assert len(pairs) == len(report["interchange"]) >= 4 * 3


def test_the_registry_records_the_measured_impact(report: dict) -> None:
    reg = pytest.importorskip("nvfp4.deviation_registry")
    for d in reg.deviations():
        m = report["deviations"].get(d.id)
        if m is None or m.get("kl") is None:
            continue
        assert d.impact is not None, d.id
        assert d.impact["t6_tokens"] == m["tokens"], d.id
        assert d.impact["t6_kl"] == pytest.approx(m["kl"], rel=0.01, abs=1e-15), d.id


def test_the_doc_is_the_report_rendered(report: dict) -> None:
    pytest.importorskip("nvfp4.deviation_registry")
    doc = ROOT / "docs" / "deviation-impact.md"
    assert doc.read_text(encoding="utf-8") == _tool().render_doc(report)
