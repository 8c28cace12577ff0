"""Reading a certificate: :func:`read_certificate` parses a certificate file and checks it
against the schema of its ``schema_version``; :func:`tier_summary` and :data:`TIER_NAMES`
read the per-tier figures out of its tests (the builder stores them; the renderer and
engines' reports show them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .certificate_schema import CertificateSchemaError, validate

__all__ = ["TIER_NAMES", "number", "read_certificate", "tier_summary"]

#: What each tier certifies, in a word.
TIER_NAMES = {
    "T0": "codec",
    "T1": "planes",
    "T2": "quantize",
    "T3": "dequantize",
    "T4": "matmul",
    "T5": "golden",
    "T6": "parity",
    "T7": "sharded",
}
#: Figures a test measures against the ``tolerance`` it records, most telling first.
_MEASURED = ("max_rel_err_beyond_floor", "max_rel_err", "disagreement_fraction")


def read_certificate(path: str | Path) -> dict[str, Any]:
    """The certificate in ``path`` (JSON), checked against its schema; a file that is not
    one raises :class:`~nvfp4_conformance.certificate_schema.CertificateSchemaError` naming
    it."""
    p = Path(path)
    try:
        cert = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CertificateSchemaError(str(p), [f"$: not readable as JSON ({exc})"]) from exc
    validate(cert, str(p))
    checked: dict[str, Any] = cert
    return checked


def number(v: Any) -> float | None:
    """A recorded figure as a float (``"nan"`` / ``"inf"`` are how the JSON spells them)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if v in ("nan", "inf", "-inf"):
        return float(v)
    return None


def _worst(tests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The case whose measured error is the largest fraction of its tolerance."""
    worst: dict[str, Any] | None = None
    for t in tests:
        for case in t["cases"]:
            tol = number(case.get("tolerance"))
            key = next((k for k in _MEASURED if k in case), None)
            if tol is None or tol < 0 or key is None:
                continue
            value = number(case[key])
            if value is None or not math.isfinite(value):
                fraction = math.inf
            elif tol == 0:  # an exact rule (the reference's 0 disagreements)
                fraction = 0.0 if value == 0 else math.inf
            else:
                fraction = value / tol
            if worst is None or fraction > worst["fraction_of_tolerance"]:
                worst = {
                    "figure": key,
                    "value": case[key],
                    "tolerance": case["tolerance"],
                    "fraction_of_tolerance": fraction,
                    "test": t["nodeid"],
                    "case": case.get("case"),
                }
    if worst is not None and not math.isfinite(worst["fraction_of_tolerance"]):
        worst["fraction_of_tolerance"] = "inf"
    return worst


def tier_summary(
    tests: list[dict[str, Any]], left_out: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per tier: how many tests ran and how they ended, the worst measured error against its
    tolerance (tiers that measure errors), the exact tiers' mismatch count, T6's tokens, and
    the verdict (``passed``, ``failed``, ``partial``, ``not run``)."""
    tiers = sorted({t["tier"] for t in tests} | {e["tier"] for e in left_out})
    out: dict[str, dict[str, Any]] = {}
    for tier in tiers:
        ts = [t for t in tests if t["tier"] == tier]
        failed = sum(1 for t in ts if t["outcome"] in ("failed", "error"))
        illegal = sum(1 for t in ts if t["skip_kind"] == "illegal")
        skipped = sum(1 for t in ts if t["outcome"] == "skipped")
        not_run = sum(1 for t in ts if t["outcome"] == "not run")
        left = sum(e["tests"] for e in left_out if e["tier"] == tier)
        entry: dict[str, Any] = {
            "name": TIER_NAMES.get(tier, ""),
            "tests": len(ts),
            "passed": sum(1 for t in ts if t["outcome"] == "passed"),
            "failed": failed,
            "skipped": skipped,
            "left_out": left,
            "worst": _worst(ts),
        }
        mismatches = [
            c["mismatches"]
            for t in ts
            for c in t["cases"]
            if isinstance(c.get("mismatches"), int) and not isinstance(c["mismatches"], bool)
        ]
        if mismatches:
            entry["mismatches"] = sum(mismatches)
        parity = [c for t in ts for c in t["cases"] if c.get("kind") == "parity"]
        if parity:
            entry["tokens_reproduced"] = sum(int(c.get("tokens_matched") or 0) for c in parity)
            entry["tokens_expected"] = sum(int(c.get("tokens_expected") or 0) for c in parity)
        if failed or illegal:
            entry["verdict"] = "failed"
        elif not ts or len(ts) == not_run:
            entry["verdict"] = "not run"
        elif left or not_run:
            entry["verdict"] = "partial"
        else:
            entry["verdict"] = "passed"
        out[tier] = entry
    return out
