"""The conformance certificate: a JSON document and its Markdown twin.

The JSON holds the suite and spec versions, the backend (name, version, package, declared
capabilities), the device ("Triton interpreter on CPU" when ``TRITON_INTERPRET=1``, never a
GPU name then; "<machine> under emulation (...): ..." under qemu-user, with the evidence in
``platform.emulation``: :mod:`nvfp4_conformance.emulation`), where nvfp4-core, the suite and
the backend were imported from (the installed wheels, not a source tree), every conformance
test's outcome with the figures it measured (errors against tolerances, counts), the
capabilities certified and not certified, the T6 parity figures and the run time.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from nvfp4.hardware import cpu_model

from ._version import __version__
from .attribution import failing_explanation, verdict
from .certificate_read import number, tier_summary
from .certificate_render import render_markdown
from .certificate_schema import SCHEMA_VERSION, validate
from .certificate_t7 import t7_section
from .recording import ConformanceRun, TestOutcome, jsonable

__all__ = [
    "SCHEMA_VERSION",
    "build_certificate",
    "capability_status",
    "render_markdown",
    "tier_summary",
    "write_certificate",
]

#: The T6 activation-quality figures averaged over the prompts, per mode.
_QUALITY_FIGURES = (
    "mean_kl_w4a16_to_mode",
    "top1_agreement_vs_w4a16",
    "mean_kl_float32_to_mode",
    "top1_agreement_vs_float32",
)


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
        tests = [o for o in by_cap.get(cap, []) if o.skip_kind not in ("capability", "spec")]
        later = [o for o in by_cap.get(cap, []) if o.skip_kind == "spec"]
        if cap not in declared:
            status[cap] = ("not certified", "not declared by the backend")
        elif not tests and later:
            status[cap] = (
                "not certified",
                f"its tests apply from a later spec version; certifying {run.spec_version}",
            )
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
    quality = _activation_quality(t6)
    if quality:
        out["activation_quality"] = quality
    return out


def _activation_quality(t6: list[TestOutcome]) -> dict[str, Any]:
    """Per quantized activation mode T6 measured: the figures averaged over the prompts, the
    prompts' own figures, the seconds it took, and - next to W4A4's - the mode's KL against
    W4A16 as a fraction of W4A4's."""
    by_mode: dict[str, dict[str, Any]] = {}
    for o in t6:
        for c in o.cases:
            mode = c.figures.get("mode")
            if not isinstance(mode, str):
                continue
            entry = by_mode.setdefault(mode, {"prompts": [], "seconds": None})
            if c.figures.get("kind") == "activation_quality":
                entry["prompts"].append({"case": c.case, **c.figures})
            elif c.figures.get("kind") == "activation_quality_time":
                entry["seconds"] = c.figures.get("seconds")
    for entry in by_mode.values():
        prompts = entry["prompts"]
        for key in _QUALITY_FIGURES:
            numbers = [number(p.get(key)) for p in prompts]
            if prompts and all(n is not None for n in numbers):
                entry[key] = sum(n for n in numbers if n is not None) / len(numbers)
    w4a4 = number(by_mode.get("w4a4", {}).get("mean_kl_w4a16_to_mode"))
    for mode, entry in by_mode.items():
        kl = number(entry.get("mean_kl_w4a16_to_mode"))
        if mode != "w4a4" and kl is not None and w4a4:
            entry["kl_w4a16_to_mode_over_w4a4"] = kl / w4a4
    return {mode: by_mode[mode] for mode in sorted(by_mode)}


def _left_out(run: ConformanceRun) -> list[dict[str, Any]]:
    """What did not run, per tier and reason: deselected tests, and tests that never ran."""
    out = [
        {"tier": tier, "tests": n, "reason": reason}
        for (tier, reason), n in sorted(run.left_out.items())
    ]
    not_run: dict[str, int] = {}
    for o in run.outcomes.values():
        if o.outcome == "not run":
            not_run[o.tier] = not_run.get(o.tier, 0) + 1
    out += [
        {
            "tier": tier,
            "tests": n,
            "reason": "collected but never ran (the session stopped early: -x, --maxfail or "
            "an interrupt)",
        }
        for tier, n in sorted(not_run.items())
    ]
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
    # the kernels object core's nvfp4.Frontend wraps is where the backend's code lives
    backend_module = type(getattr(run.backend, "kernels", run.backend)).__module__
    left_out = _left_out(run)
    tests = [
        {
            "nodeid": o.nodeid,
            "tier": o.tier,
            "outcome": o.outcome,
            "skip_kind": o.skip_kind or None,
            "hypothesis": o.hypothesis,
            "capabilities": o.capabilities,
            "duration_s": round(o.duration_s, 4),
            "message": o.message,
            "cases": [{"case": c.case, **c.figures} for c in o.cases],
        }
        for o in outcomes
    ]
    for test in tests:  # the declared deviations that explain a failure, or null
        failing = test["outcome"] in ("failed", "error")
        test["explained_by"] = failing_explanation(test) if failing else None
    return {
        "schema_version": SCHEMA_VERSION,
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
            "cpu": cpu_model(),
            # qemu-user evidence and the runner's word (nvfp4_conformance.emulation); null
            # for a native run
            "emulation": run.extra.get("emulation"),
            "versions": _versions(),
        },
        "started_unix": run.started,
        "duration_s": round(finished - run.started, 3),
        "summary": counts,
        "tiers": tier_summary(tests, left_out),
        "deselected": run.deselected,
        "left_out": left_out,
        "capabilities": {cap: {"state": state, "why": why} for cap, (state, why) in status.items()},
        "capabilities_certified": sorted(c for c, (s, _) in status.items() if s == "certified"),
        "capabilities_not_certified": sorted(c for c, (s, _) in status.items() if s != "certified"),
        "illegal_skips": [o.nodeid for o in run.illegal_skips()],
        "t6": _t6_summary(run),
        **t7_section(run),  # only when T7 (sharding, spec 1.2) ran
        "verdict": verdict(tests, result, run.spec_version),
        "tests": tests,
    }


def write_certificate(run: ConformanceRun, path: str | Path) -> tuple[Path, Path]:
    """Write ``path`` (JSON) and ``path`` with suffix ``.md``; return both paths. The JSON is
    checked against its schema first (:mod:`nvfp4_conformance.certificate_schema`): a
    certificate this suite cannot vouch for is never written."""
    json_path = Path(path)
    md_path = json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    cert = build_certificate(run)
    validate(json.loads(json.dumps(cert)), str(json_path))
    json_path.write_text(json.dumps(cert, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(cert), encoding="utf-8")
    return json_path, md_path
