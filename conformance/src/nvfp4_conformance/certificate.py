"""The conformance certificate: a JSON document and its Markdown twin.

The JSON holds the suite and spec versions, the backend (name, version, package, declared
capabilities), the device ("Triton interpreter on CPU" when ``TRITON_INTERPRET=1``, never a
GPU name then), where nvfp4-core, the suite and the backend were imported from (the
installed wheels, not a source tree), every conformance test's outcome with the figures it
measured (errors against tolerances, counts), the capabilities certified and not certified,
the T6 parity figures and the run time.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from ._version import __version__
from .recording import ConformanceRun, TestOutcome, jsonable

__all__ = ["build_certificate", "capability_status", "render_markdown", "write_certificate"]

CERTIFICATE_FORMAT = 1


def capability_status(run: ConformanceRun) -> dict[str, tuple[str, str]]:
    """``{capability: (state, why)}`` with state ``certified``, ``failed``, ``partial`` or
    ``not certified``."""
    from nvfp4.backend import CAPABILITIES

    declared = run.declared_capabilities
    by_cap: dict[str, list[TestOutcome]] = {}
    for o in run.outcomes.values():
        for cap in o.capabilities:
            by_cap.setdefault(cap, []).append(o)
    status: dict[str, tuple[str, str]] = {}
    for cap in sorted(set(CAPABILITIES) | set(by_cap)):
        # a test that also needs an undeclared capability was skipped for that one: it
        # neither certifies nor fails this capability
        tests = [o for o in by_cap.get(cap, []) if o.skip_kind != "capability"]
        if cap not in declared:
            status[cap] = ("not certified", "not declared by the backend")
        elif not tests and by_cap.get(cap):
            status[cap] = ("not certified", "its tests also need a capability not declared")
        elif not tests and run.deselected:
            status[cap] = ("not certified", "its tests were deselected")
        elif not tests:
            status[cap] = ("not certified", "declared, but this suite version has no test for it")
        elif any(o.outcome in ("failed", "error") or o.skip_kind == "illegal" for o in tests):
            bad = sum(1 for o in tests if o.outcome != "passed")
            status[cap] = ("failed", f"{bad} of {len(tests)} tests did not pass")
        elif any(o.outcome != "passed" for o in tests) or run.deselected:
            status[cap] = ("partial", "not every conformance test ran")
        else:
            status[cap] = ("certified", f"{len(tests)} tests passed")
    return status


def _module_file(name: str) -> str:
    mod = sys.modules.get(name)
    return str(getattr(mod, "__file__", "") or "")


def _versions() -> dict[str, str]:
    """Versions of the libraries this run imported."""
    out = {"python": platform.python_version()}
    for mod, dist in (
        ("numpy", "numpy"),
        ("ml_dtypes", "ml_dtypes"),
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("triton", "triton"),
        ("mlx", "mlx"),
        ("gguf", "gguf"),
    ):
        if mod in sys.modules:
            try:
                out[mod] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                out[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    return out


def _t6_summary(run: ConformanceRun) -> dict[str, Any]:
    t6 = [o for o in run.outcomes.values() if o.tier == "T6"]
    prompts = [c for o in t6 for c in o.cases if c.figures.get("kind") == "parity"]
    out: dict[str, Any] = {"prompts": [{"case": c.case, **c.figures} for c in prompts]}
    extra = run.extra.get("t6")
    if extra:
        out.update(jsonable(extra))
    if prompts:
        for key in ("top1_agreement_vs_float32", "mean_kl_float32_to_nvfp4"):
            values = [c.figures.get(key) for c in prompts]
            numbers = [float(v) for v in values if isinstance(v, (int, float))]
            if len(numbers) == len(values):
                out[key] = sum(numbers) / len(numbers)
        out["tokens_reproduced"] = sum(int(c.figures.get("tokens_matched", 0)) for c in prompts)
        out["tokens_expected"] = sum(int(c.figures.get("tokens_expected", 0)) for c in prompts)
    return out


def build_certificate(run: ConformanceRun) -> dict[str, Any]:
    """The certificate of a finished run, as a JSON-able dict."""
    import nvfp4

    info = run.backend.info
    finished = run.finished or time.time()
    status = capability_status(run)
    outcomes = sorted(run.outcomes.values(), key=lambda o: (o.tier, o.nodeid))
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    failed = any(o.outcome in ("failed", "error") for o in outcomes) or bool(run.illegal_skips())
    if failed or (run.exit_status not in (None, 0)):
        result = "failed"
    elif run.deselected or any(o.outcome == "not run" for o in outcomes):
        result = "partial"
    else:
        result = "certified"
    backend_module = type(run.backend).__module__
    return {
        "certificate_format": CERTIFICATE_FORMAT,
        "result": result,
        "exit_status": run.exit_status,
        "suite": {"name": "nvfp4-conformance", "version": __version__},
        "spec_version": run.spec_version,
        "core": {"name": "nvfp4-core", "version": nvfp4.__version__},
        "backend": {
            "name": info.name,
            "requested_as": run.backend_name,
            "version": info.version,
            "package": info.package,
            "spec_versions": list(info.spec_versions),
            "priority": info.priority,
            "capabilities_declared": sorted(info.capabilities),
            "notes": list(info.notes),
        },
        "device": run.extra.get("device"),
        "device_reported_by_backend": run.extra.get("backend_device"),
        "imported_from": {
            "nvfp4": _module_file("nvfp4"),
            "nvfp4_conformance": _module_file("nvfp4_conformance"),
            "backend": _module_file(backend_module),
        },
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "versions": _versions(),
        },
        "started_unix": run.started,
        "duration_s": round(finished - run.started, 3),
        "summary": counts,
        "deselected": run.deselected,
        "capabilities": {cap: {"state": state, "why": why} for cap, (state, why) in status.items()},
        "capabilities_certified": sorted(c for c, (s, _) in status.items() if s == "certified"),
        "capabilities_not_certified": sorted(c for c, (s, _) in status.items() if s != "certified"),
        "illegal_skips": [o.nodeid for o in run.illegal_skips()],
        "t6": _t6_summary(run),
        "tests": [
            {
                "nodeid": o.nodeid,
                "tier": o.tier,
                "outcome": o.outcome,
                "skip_kind": o.skip_kind or None,
                "capabilities": o.capabilities,
                "duration_s": round(o.duration_s, 4),
                "message": o.message,
                "cases": [{"case": c.case, **c.figures} for c in o.cases],
            }
            for o in outcomes
        ],
    }


# ------------------------------------------------------------------------- markdown
_COLUMNS = (
    "dtype",
    "shape",
    "max_abs_err",
    "max_ref",
    "max_rel_err",
    "tolerance",
    "mismatches",
    "disagreements",
    "ties",
)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return "x".join(str(x) for x in v) if all(isinstance(x, int) for x in v) else str(v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def render_markdown(cert: dict[str, Any]) -> str:
    """The Markdown twin of a certificate."""
    b = cert["backend"]
    lines = [
        f"# NVFP4 conformance certificate: `{b['name']}`",
        "",
        f"**Result: {cert['result'].upper()}** (exit status {cert['exit_status']})",
        "",
        "| | |",
        "|---|---|",
        f"| spec version | {cert['spec_version']} |",
        f"| suite | nvfp4-conformance {cert['suite']['version']} |",
        f"| nvfp4-core | {cert['core']['version']} |",
        f"| backend | {b['name']} {b['version']} ({b['package'] or 'no package'}) |",
        f"| device | {cert['device']} |",
        f"| platform | {cert['platform']['system']} {cert['platform']['machine']}, "
        + ", ".join(f"{k} {v}" for k, v in cert["platform"]["versions"].items())
        + " |",
        f"| run time | {cert['duration_s']:.1f} s |",
        "| tests | " + ", ".join(f"{v} {k}" for k, v in sorted(cert["summary"].items())) + " |",
        "",
        "## Capabilities",
        "",
        "| capability | state | why |",
        "|---|---|---|",
    ]
    for cap, st in cert["capabilities"].items():
        lines.append(f"| {cap} | {st['state']} | {st['why']} |")
    if cert["illegal_skips"]:
        lines += ["", "## Skips that fail the run", ""]
        lines += [f"- `{n}`" for n in cert["illegal_skips"]]

    t6 = cert.get("t6") or {}
    if t6.get("prompts"):
        lines += [
            "",
            "## T6 greedy parity",
            "",
            f"Tokens reproduced: {t6.get('tokens_reproduced')} of {t6.get('tokens_expected')}. "
            f"Quality of the NVFP4 model against the unquantized float32 model (teacher-forced "
            f"on the NVFP4 tokens): top-1 agreement {_fmt(t6.get('top1_agreement_vs_float32'))}, "
            f"mean KL(float32 || NVFP4) {_fmt(t6.get('mean_kl_float32_to_nvfp4'))} nats.",
            "",
            "| prompt | tokens matched | first mismatch | min reference margin | near-tie threshold "
            "| top-1 agreement vs f32 | mean KL vs f32 | max \\|top-1 logit - golden\\| |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in t6["prompts"]:
            lines.append(
                f"| {p['case']} | {p.get('tokens_matched')}/{p.get('tokens_expected')} "
                f"| {_fmt(p.get('first_mismatch'))} | {_fmt(p.get('min_reference_margin'))} "
                f"| {_fmt(p.get('near_tie_threshold'))} "
                f"| {_fmt(p.get('top1_agreement_vs_float32'))} "
                f"| {_fmt(p.get('mean_kl_float32_to_nvfp4'))} "
                f"| {_fmt(p.get('max_abs_top1_logit_diff_vs_golden'))} |"
            )

    lines += ["", "## Tests", ""]
    by_tier: dict[str, list[dict[str, Any]]] = {}
    for t in cert["tests"]:
        by_tier.setdefault(t["tier"], []).append(t)
    for tier, tests in sorted(by_tier.items()):
        lines += [f"### {tier}", ""]
        present = [c for c in _COLUMNS if any(c in case for t in tests for case in t["cases"])]
        header = ["test", "outcome", "case", *present, "other figures"]
        lines.append("| " + " | ".join(h.replace("|", "\\|") for h in header) + " |")
        lines.append("|" + "---|" * len(header))
        for t in tests:
            cases = t["cases"] or [{"case": ""}]
            for i, case in enumerate(cases):
                other = ", ".join(
                    f"{k}={_fmt(v)}"
                    for k, v in case.items()
                    if k not in present and k not in ("case", "kind")
                )
                row = [
                    f"`{_short(t['nodeid'])}`" if i == 0 else "",
                    t["outcome"] if i == 0 else "",
                    _fmt(case.get("case", "")),
                    *[_fmt(case.get(c, "")) for c in present],
                    other,
                ]
                lines.append("| " + " | ".join(row) + " |")
        failures = [
            t for t in tests if t["outcome"] in ("failed", "error") or t["skip_kind"] == "illegal"
        ]
        for t in failures:
            lines += [
                "",
                f"**{t['outcome']}**: `{_short(t['nodeid'])}`",
                "",
                "```",
                t["message"],
                "```",
            ]
        lines.append("")
    return "\n".join(lines) + "\n"


def write_certificate(run: ConformanceRun, path: str | Path) -> tuple[Path, Path]:
    """Write ``path`` (JSON) and ``path`` with suffix ``.md``; return both paths."""
    json_path = Path(path)
    md_path = json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    cert = build_certificate(run)
    json_path.write_text(json.dumps(cert, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(cert), encoding="utf-8")
    return json_path, md_path
