"""The state of one conformance run: the backend under test, the spec version, what every
test measured and how it ended. The plugin fills it; :mod:`nvfp4_conformance.certificate`
turns it into the certificate."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CaseRecord", "ConformanceRun", "TestOutcome", "jsonable", "tier_of"]


def tier_of(nodeid: str) -> str:
    """``.../test_t4_matmul.py::test_qmm[...]`` -> ``"T4"`` (``"?"`` when not a tier file)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if module.startswith("test_t") and len(module) > 6 and module[6].isdigit():
        return "T" + module[6]
    return "?"


def jsonable(value: Any) -> Any:
    """A measured figure as plain JSON: numpy scalars and arrays become Python numbers and
    lists, non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        if math.isfinite(f):
            return f
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    if value is None or isinstance(value, str):
        return value
    return str(value)


@dataclass
class CaseRecord:
    """Figures one test measured for one case (``max_abs_err``, ``tolerance``, ...)."""

    case: str
    figures: dict[str, Any]


@dataclass
class TestOutcome:
    """How one conformance test ended."""

    nodeid: str
    tier: str
    outcome: str = "not run"  # passed | failed | error | skipped | not run
    duration_s: float = 0.0
    capabilities: list[str] = field(default_factory=list)
    message: str = ""
    skip_kind: str = ""  # capability | spec | illegal
    hypothesis: bool = False  # a Hypothesis test: one case recorded per example
    cases: list[CaseRecord] = field(default_factory=list)


@dataclass
class ConformanceRun:
    """Everything the certificate needs, gathered during one pytest session."""

    backend_name: str | None = None
    backend: Any = None
    spec_version: str | None = None
    certificate_path: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    capability_skips: dict[str, str] = field(default_factory=dict)
    spec_skips: dict[str, str] = field(default_factory=dict)
    deselected: int = 0
    #: ``{(tier, reason): number of tests}``: the conformance tests deselected, and why
    left_out: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the tiers ``--nvfp4-tiers`` selected (``None``: every tier)
    tiers_selected: frozenset[str] | None = None
    exit_status: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def outcome(self, nodeid: str) -> TestOutcome:
        if nodeid not in self.outcomes:
            self.outcomes[nodeid] = TestOutcome(nodeid, tier_of(nodeid))
        return self.outcomes[nodeid]

    def record(self, nodeid: str, case: str, figures: dict[str, Any]) -> None:
        self.outcome(nodeid).cases.append(CaseRecord(case, jsonable(figures)))

    def illegal_skips(self) -> list[TestOutcome]:
        """Skips that are neither a capability the backend does not declare nor a test
        newer than the spec version under test: each one fails the run."""
        return [
            o for o in self.outcomes.values() if o.outcome == "skipped" and o.skip_kind == "illegal"
        ]

    @property
    def declared_capabilities(self) -> frozenset[str]:
        if self.backend is None:
            return frozenset()
        return frozenset(self.backend.info.capabilities)
