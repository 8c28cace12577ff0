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
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

from nvfp4.hardware import cpu_model

from ._version import __version__
from .certificate_schema import SCHEMA_VERSION, validate
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

#: What each tier certifies, in a word.
TIER_NAMES = {
    "T0": "codec",
    "T1": "planes",
    "T2": "quantize",
    "T3": "dequantize",
    "T4": "matmul",
    "T5": "golden",
    "T6": "parity",
}
#: Figures a test measures against the ``tolerance`` it records, most telling first.
_MEASURED = ("max_rel_err", "disagreement_fraction")


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
            numbers = [_number(p.get(key)) for p in prompts]
            if prompts and all(n is not None for n in numbers):
                entry[key] = sum(n for n in numbers if n is not None) / len(numbers)
    w4a4 = _number(by_mode.get("w4a4", {}).get("mean_kl_w4a16_to_mode"))
    for mode, entry in by_mode.items():
        kl = _number(entry.get("mean_kl_w4a16_to_mode"))
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


def _number(v: Any) -> float | None:
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
            tol = _number(case.get("tolerance"))
            key = next((k for k in _MEASURED if k in case), None)
            if tol is None or tol < 0 or key is None:
                continue
            value = _number(case[key])
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
    # the kernels object core's nvfp4.Backend wraps is where the backend's code lives
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
        "tests": tests,
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
    """A recorded value as people read it: tuples as ``(0, 16, 24, 32)``, lists of names
    comma-separated, nothing (``None``, ``""``, ``[]``) as ``-``."""
    if v is None or v == "" or v == [] or v == {}:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, str) for x in v):
            return ", ".join(_fmt(x) for x in v)
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v).replace("|", "\\|").replace("\n", " ")


def _fmt_shape(v: Any) -> str:
    """A shape as ``16x4096``."""
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        return "x".join(str(x) for x in v)
    return _fmt(v)


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def _tier_title(tier: str) -> str:
    name = TIER_NAMES.get(tier, "")
    return f"{tier} {name}" if name else tier


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _worst_text(entry: dict[str, Any]) -> str:
    """The summary's "worst error / tolerance" cell of one tier."""
    w = entry.get("worst")
    parts = []
    if w:
        frac = _number(w["fraction_of_tolerance"])
        if _number(w["tolerance"]) == 0:
            share = "an exact rule"
        elif frac is None or not math.isfinite(frac):
            share = "not finite"
        elif frac < 10:
            share = f"{frac:.0%} of it"
        else:
            share = f"{frac:.3g} times it"
        parts.append(
            f"{w['figure']} {_fmt(w['value'])} / {_fmt(w['tolerance'])} ({share}), "
            f"`{_short(w['test'])}`"
        )
    elif "mismatches" in entry:
        parts.append(f"exact: {_plural(entry['mismatches'], 'mismatched element')}")
    if "tokens_expected" in entry:
        parts.append(f"{entry['tokens_reproduced']}/{entry['tokens_expected']} tokens reproduced")
    return "; ".join(parts) or "-"


def _result_line(cert: dict[str, Any]) -> str:
    summary = cert.get("summary", {})
    ran = sum(v for k, v in summary.items() if k != "not run")
    bad = summary.get("failed", 0) + summary.get("error", 0)
    illegal = len(cert.get("illegal_skips") or [])
    left = sum(e["tests"] for e in cert.get("left_out") or [])
    result = cert["result"]
    if result == "certified":
        why = f"all {ran} conformance tests ran and passed"
    elif result == "partial":
        why = f"the {ran} tests that ran passed; {_plural(left, 'test')} did not run (below)"
    else:
        reasons = []
        if bad:
            reasons.append(f"{bad} of {ran} tests failed")
        if illegal:
            reasons.append(f"{_plural(illegal, 'test')} skipped without a declared reason")
        if not reasons:
            reasons.append(f"pytest exit status {cert['exit_status']}")
        why = "; ".join(reasons)
    return f"**Result: {result.upper()}** - {why}."


def _summary(cert: dict[str, Any]) -> list[str]:
    """The one-screen summary at the top of the Markdown."""
    b = cert["backend"]
    tiers = cert.get("tiers") or tier_summary(cert["tests"], cert.get("left_out") or [])
    lines = [
        _result_line(cert),
        "",
        f"Backend `{b['name']}` {b['version'] or '(no version)'} "
        f"({b['package'] or 'no package'}), spec {cert['spec_version']}, device: "
        f"{_fmt(cert['device'])}; {cert['duration_s']:.1f} s.",
        "",
        "| tier | tests | passed | failed | skipped | worst error / tolerance | verdict |",
        "|---|--:|--:|--:|--:|---|---|",
    ]
    for tier, e in tiers.items():
        lines.append(
            f"| {_tier_title(tier)} | {e['tests']} | {e['passed']} | {e['failed']} "
            f"| {e['skipped']} | {_worst_text(e)} | {e['verdict']} |"
        )
    quality = (cert.get("t6") or {}).get("activation_quality") or {}
    if quality:
        lines += ["", _quality_summary(quality)]
    left_out = cert.get("left_out") or []
    if left_out:
        lines += ["", "Left out (not run, so not certified):", ""]
        lines += [
            f"- {_tier_title(e['tier'])}: {_plural(e['tests'], 'test')}, {e['reason']}"
            for e in left_out
        ]
    if cert.get("illegal_skips"):
        lines += ["", "Skips that fail the run:", ""]
        lines += [f"- `{n}`" for n in cert["illegal_skips"]]
    notes = b.get("notes") or []
    lines += ["", "Backend notes:", ""]
    lines += [f"- {_fmt(n)}" for n in notes] if notes else ["- (the backend gives none)"]
    certified = cert.get("capabilities_certified") or []
    lines += [
        "",
        f"Capabilities certified: {', '.join(certified) if certified else 'none'}.",
        "",
        "| capability | state | why |",
        "|---|---|---|",
    ]
    for cap, st in cert["capabilities"].items():
        lines.append(f"| {cap} | {st['state']} | {_fmt(st['why'])} |")
    return lines


def _details(cert: dict[str, Any]) -> list[str]:
    b = cert["backend"]
    versions = cert["platform"]["versions"]
    return [
        "## The run",
        "",
        "| | |",
        "|---|---|",
        f"| spec version | {cert['spec_version']} |",
        f"| suite | nvfp4-conformance {cert['suite']['version']} |",
        f"| nvfp4-core | {cert['core']['version']} |",
        f"| backend | {b['name']} {b['version']} ({b['package'] or 'no package'}) |",
        f"| capabilities declared | {_fmt(b['capabilities_declared'])} |",
        f"| device | {_fmt(cert['device'])} |",
        f"| platform | {cert['platform']['system']} {cert['platform']['machine']}"
        + (" (emulated)" if cert["platform"].get("emulation") else "")
        + (f", CPU {cert['platform']['cpu']}" if cert["platform"].get("cpu") else "")
        + ", "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + " |",
        f"| run time | {cert['duration_s']:.1f} s (exit status {cert['exit_status']}) |",
        "| tests | " + ", ".join(f"{v} {k}" for k, v in sorted(cert["summary"].items())) + " |",
        *(
            f"| {name} imported from | {_fmt(path)} |"
            for name, path in (cert.get("imported_from") or {}).items()
        ),
    ]


def _t6(cert: dict[str, Any]) -> list[str]:
    t6 = cert.get("t6") or {}
    if not t6.get("prompts"):
        return []
    lines = [
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
            f"| {_fmt(p['case'])} | {p.get('tokens_matched')}/{p.get('tokens_expected')} "
            f"| {_fmt(p.get('first_mismatch'))} | {_fmt(p.get('min_reference_margin'))} "
            f"| {_fmt(p.get('near_tie_threshold'))} "
            f"| {_fmt(p.get('top1_agreement_vs_float32'))} "
            f"| {_fmt(p.get('mean_kl_float32_to_nvfp4'))} "
            f"| {_fmt(p.get('max_abs_top1_logit_diff_vs_golden'))} |"
        )
    return lines + _quality_lines(t6.get("activation_quality") or {})


def _quality_summary(quality: dict[str, Any]) -> str:
    """The summary's one line on T6's quantized activation modes."""
    parts = []
    for mode, q in quality.items():
        ratio = q.get("kl_w4a16_to_mode_over_w4a4")
        of_w4a4 = f" ({_fmt(ratio)} of W4A4's)" if ratio is not None else ""
        parts.append(
            f"{mode} {_fmt(q.get('mean_kl_w4a16_to_mode'))}{of_w4a4}, "
            f"top-1 {_fmt(q.get('top1_agreement_vs_w4a16'))}"
        )
    return (
        "T6 quantized activations (information; mean KL(W4A16 || mode) in nats, top-1 "
        "agreement with W4A16): " + "; ".join(parts) + "."
    )


def _quality_lines(quality: dict[str, Any]) -> list[str]:
    """The T6 activation-quality table: one row per quantized activation mode."""
    if not quality:
        return []
    lines = [
        "",
        "### Quantized activations",
        "",
        "The same NVFP4 model with every linear computing in each quantized activation mode "
        "the backend declares (dynamic per-call scales), teacher-forced on the golden tokens, "
        "against the W4A16 model above and the float32 model; means over the prompts. For "
        "information: the spec bounds no model-level quantization error.",
        "",
        "| mode | mean KL(W4A16 \\|\\| mode) | KL / W4A4's | top-1 vs W4A16 "
        "| mean KL(float32 \\|\\| mode) | top-1 vs float32 | prompts | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, q in quality.items():
        lines.append(
            f"| {mode} | {_fmt(q.get('mean_kl_w4a16_to_mode'))} "
            f"| {_fmt(q.get('kl_w4a16_to_mode_over_w4a4'))} "
            f"| {_fmt(q.get('top1_agreement_vs_w4a16'))} "
            f"| {_fmt(q.get('mean_kl_float32_to_mode'))} "
            f"| {_fmt(q.get('top1_agreement_vs_float32'))} | {len(q.get('prompts') or [])} "
            f"| {_fmt(q.get('seconds'))} |"
        )
    return lines


def _skip_reason(t: dict[str, Any]) -> str:
    """Why a test was skipped; never empty."""
    if t["message"].strip():
        return _fmt(t["message"])
    if t["skip_kind"] == "capability":
        missing = ", ".join(t["capabilities"]) or "a capability"
        return f"needs {missing}, which the backend does not declare: not certified"
    if t["skip_kind"] == "spec":
        return "applies from a later spec version than the one certified"
    return "skipped without a reason: a skip the backend did not declare fails the run"


def _folded(t: dict[str, Any], present: list[str]) -> list[tuple[list[str], int]]:
    """The test's case rows, identical ones (repeated Hypothesis examples) folded into one
    row with a count, in the order they first appear."""
    rows: dict[tuple[str, ...], int] = {}
    for case in t["cases"] or [{}]:
        other = ", ".join(
            f"{k}={_fmt(v)}"
            for k, v in case.items()
            if k not in present and k not in ("case", "kind")
        )
        cells = (
            _fmt(case.get("case")),
            *[_fmt_shape(case.get(c)) if c == "shape" else _fmt(case.get(c)) for c in present],
            other or "-",
        )
        rows[cells] = rows.get(cells, 0) + 1
    return [(list(cells), n) for cells, n in rows.items()]


#: Figures a Hypothesis row gives as their largest value over the examples.
_LARGEST = ("max_abs_err", "max_ref", "max_rel_err", "disagreement_fraction")


def _over_examples(key: str, values: list[Any]) -> str:
    """One figure over all of a Hypothesis test's examples: shapes as a range, errors as the
    largest, counts summed, anything else as its distinct values."""
    given = [v for v in values if v not in (None, "", [])]
    if not given:
        return "-"
    if key == "shape" and all(isinstance(v, list) for v in given):
        shapes = sorted({tuple(v) for v in given}, key=lambda sh: (math.prod(sh), sh))
        ends = [_fmt_shape(list(shapes[0])), _fmt_shape(list(shapes[-1]))]
        return ends[0] if len(shapes) == 1 else f"{ends[0]} to {ends[1]}"
    numbers = [_number(v) for v in given]
    if key in _LARGEST and all(n is not None for n in numbers):
        return "max " + _fmt(max(numbers, key=lambda n: math.inf if math.isnan(n) else n))
    if all(isinstance(v, int) and not isinstance(v, bool) for v in given):
        return _fmt(sum(given))
    distinct = list(dict.fromkeys(_fmt(v) for v in values))
    return ", ".join(distinct) if len(distinct) <= 3 else f"{len(distinct)} distinct values"


def _hypothesis_row(t: dict[str, Any], present: list[str]) -> list[str]:
    """All of a Hypothesis test's examples as one row."""
    cases = t["cases"]
    keys = [k for k in dict.fromkeys(k for c in cases for k in c) if k not in ("case", "kind")]
    other = ", ".join(
        f"{k}={_over_examples(k, [c.get(k) for c in cases])}" for k in keys if k not in present
    )
    return [
        f"{len(cases)} Hypothesis examples",
        *[_over_examples(c, [case.get(c) for case in cases]) for c in present],
        other or "-",
    ]


def _tests(cert: dict[str, Any]) -> list[str]:
    lines = ["", "## Tests", ""]
    by_tier: dict[str, list[dict[str, Any]]] = {}
    for t in cert["tests"]:
        by_tier.setdefault(t["tier"], []).append(t)
    for tier, tests in sorted(by_tier.items()):
        lines += [f"### {_tier_title(tier)}", ""]
        present = [c for c in _COLUMNS if any(c in case for t in tests for case in t["cases"])]
        header = ["test", "outcome", "case", *present, "other figures"]
        lines.append("| " + " | ".join(h.replace("|", "\\|") for h in header) + " |")
        lines.append("|" + "---|" * len(header))
        for t in tests:
            if t.get("hypothesis") and len(t["cases"]) > 1:
                cells = _hypothesis_row(t, present)
                lines.append(
                    f"| `{_short(t['nodeid'])}` | {t['outcome']} | " + " | ".join(cells) + " |"
                )
                continue
            for i, (cells, n) in enumerate(_folded(t, present)):
                if n > 1:
                    cells[0] += f" ({n} times)"
                first = [f"`{_short(t['nodeid'])}`", t["outcome"]] if i == 0 else ["", ""]
                lines.append("| " + " | ".join(first + cells) + " |")
        if any(t.get("hypothesis") and len(t["cases"]) > 1 for t in tests):
            lines += [
                "",
                "A Hypothesis test is one row for all its examples: counts summed, errors the "
                "largest (max), shapes as a range; each example is in the JSON.",
            ]
        skipped = [t for t in tests if t["outcome"] == "skipped"]
        if skipped:
            lines += ["", "| skipped test | reason |", "|---|---|"]
            lines += [f"| `{_short(t['nodeid'])}` | {_skip_reason(t)} |" for t in skipped]
        failures = [
            t for t in tests if t["outcome"] in ("failed", "error") or t["skip_kind"] == "illegal"
        ]
        for t in failures:
            lines += [
                "",
                f"**{t['outcome']}**: `{_short(t['nodeid'])}`",
                "",
                "```",
                t["message"] or _skip_reason(t),
                "```",
            ]
        lines.append("")
    return lines


def render_markdown(cert: dict[str, Any]) -> str:
    """The Markdown twin of a certificate: a one-screen summary (result, per tier, what a
    partial run left out, the backend's notes, capabilities), then the details."""
    lines = [
        f"# NVFP4 conformance certificate: `{cert['backend']['name']}`",
        "",
        *_summary(cert),
        "",
        *_details(cert),
        *_t6(cert),
        *_tests(cert),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


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
