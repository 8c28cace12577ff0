"""Rendering a certificate as Markdown: a one-screen summary (the result and why, each
tier's tests and worst error against its tolerance, what a partial run left out, the
backend's notes and capabilities), then the details, T6 and every test.

:func:`render_markdown` takes a built certificate (a dict: :mod:`.certificate` builds it,
:func:`.certificate_read.read_certificate` reads one from a file) and needs nothing else.
"""

from __future__ import annotations

import math
from typing import Any

from .certificate_read import TIER_NAMES, number, tier_summary
from .certificate_t7 import t7_markdown

__all__ = ["render_markdown"]


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
        frac = number(w["fraction_of_tolerance"])
        if number(w["tolerance"]) == 0:
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
    return f"**Result: {result.upper()}** - {why}." + _verdict_sentence(cert)


def _verdict_sentence(cert: dict[str, Any]) -> str:
    """Schema 4's conformance class (spec 1.2) after the result; nothing before."""
    v = cert.get("verdict")
    if not v:
        return ""
    text = f" **Class: {v['class']}**"
    if v["explained"]:
        shown = ", ".join(f"`{k}` ({n})" for k, n in v["explained"].items())
        text += f"; failures explained by declared deviations: {shown}"
    if v["unexplained"]:
        text += f"; {_plural(len(v['unexplained']), 'failing test')} unexplained"
    if v["unsafe"]:
        text += f"; unsafe deviations: {', '.join(f'`{u}`' for u in v['unsafe'])}"
    return text + "."


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
    numbers = [number(v) for v in given]
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
                f"**{t['outcome']}**: `{_short(t['nodeid'])}`" + _explained(t),
                "",
                "```",
                t["message"] or _skip_reason(t),
                "```",
            ]
        lines.append("")
    return lines


def _explained(t: dict[str, Any]) -> str:
    """`` - explained by `id` `` for a failing test of schema 4 (with the fraction of its
    bound the failing case uses, where the case measured one: a ``partials_relative``
    deviation), `` - unexplained`` where nothing explains it; nothing for older schemas."""
    if "explained_by" not in t or t["outcome"] not in ("failed", "error"):
        return ""
    ids = t["explained_by"]
    if not ids:
        return " - unexplained"
    used = (t.get("cases") or [{}])[-1].get("bound_used") or {}
    return " - explained by " + ", ".join(
        f"`{i}`" + (f" ({used[i]:.2g} of its bound)" if i in used else "") for i in ids
    )


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
        *t7_markdown(cert),
        *_tests(cert),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
