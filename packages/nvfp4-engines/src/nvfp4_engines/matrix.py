"""The engines matrix: ``docs/engines.md`` generated from the conformance certificates under
``reports/engines/``.

Two steps, both plain functions behind a command line::

    python -m nvfp4_engines.matrix record CERT.json ... --out reports/engines
    python -m nvfp4_engines.matrix render --reports reports/engines --out docs/engines.md

``record`` copies certificates into the reports folder with the paths of the machine that
ran them reduced to repository-relative or ``site-packages/``-relative ones (a certificate
names where each package was imported from). ``render`` writes one row per engine and its
version: the tiers, then the capabilities, each "certified", "failed" with the first failing
test, or "absent" (nothing the engine has was tested there); then every deviation found,
with its spec rule, a one-line reading and a reproducer that uses only that engine's API
(:mod:`nvfp4_engines.deviations`). ``render --check`` fails when the document on disk is
not what the certificates give. The whole-model results of
``reports/engines/whole-model/`` (:mod:`nvfp4_engines.whole_model`) get their own section.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nvfp4 import deviation_registry as registry
from nvfp4.contract import CAPABILITIES as CONTRACT_CAPABILITIES

from ._common import ENGINE_NOTE
from .deviations import Deviation, classify
from .whole_model import results as whole_model

__all__ = [
    "engine_of",
    "engine_verdict",
    "load_certificates",
    "main",
    "record",
    "render",
    "sanitize",
]

TIERS = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")
#: The tiers whose tests measure an error against a tolerance (T6 counts tokens).
MEASURED_TIERS = tuple(t for t in TIERS if t != "T6")
#: The table's capability columns: the contract's, in its order.
CAPABILITIES = tuple(CONTRACT_CAPABILITIES)
_FAILED = ("failed", "error")
_SITE = re.compile(r"[^\s'\"(]*site-packages/")
#: The measured T6 impact of the deviations (tools/measure_deviation_impact.py), beside
#: the reports' engines folder.
IMPACT = "deviation-impact.json"
#: Adapters that exist but need CUDA: rows "not run" until a GPU runner certifies them.
GPU_ADAPTERS = ("flashinfer", "vllm", "transformer-engine")


def sanitize(value: Any, root: Path) -> Any:
    """``value`` with every absolute path under ``root`` made relative to it and every path
    into a ``site-packages`` folder starting at ``site-packages/`` (recursively)."""
    if isinstance(value, str):
        return _SITE.sub("site-packages/", value).replace(str(root) + "/", "")
    if isinstance(value, list):
        return [sanitize(v, root) for v in value]
    if isinstance(value, dict):
        return {k: sanitize(v, root) for k, v in value.items()}
    return value


def record(certificates: Iterable[Path], out: Path, root: Path) -> list[Path]:
    """Copy certificates (JSON) into ``out`` as ``<backend>.json``, sanitized."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in certificates:
        cert = sanitize(json.loads(Path(path).read_text()), root)
        dest = out / f"{cert['backend']['name']}.json"
        dest.write_text(json.dumps(cert, indent=1, sort_keys=True) + "\n")
        written.append(dest)
    return written


def load_certificates(folder: Path) -> list[dict[str, Any]]:
    """Every certificate in ``folder``, ordered by backend name."""
    certs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(certs, key=lambda c: c["backend"]["name"])


def engine_of(cert: dict[str, Any]) -> str:
    """The engine and its version, from the adapter's first note (``"gguf 0.19.0"``)."""
    for note in cert["backend"].get("notes", []):
        if note.startswith(ENGINE_NOTE):
            return str(note[len(ENGINE_NOTE) :])
    return f"{cert['backend']['package']} {cert['backend']['version']}"


def _failed(cert: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in cert["tests"] if t["outcome"] in _FAILED]


def _first(tests: list[dict[str, Any]]) -> str:
    return f"failed: `{tests[0]['nodeid'].split('::', 1)[-1]}` ({len(tests)} failed)"


def _tier_cell(cert: dict[str, Any], tier: str) -> str:
    t = cert["tiers"].get(tier)
    failed = [x for x in _failed(cert) if x["tier"] == tier]
    if failed:
        return _first(failed)
    if t is None or t.get("verdict") == "not run":  # left out of the run (--nvfp4-tiers)
        return "not run"
    # absent: none of the tier's tests of a capability ran (what passed is the suite's own
    # checks, such as T6's golden self-check), or nothing ran at all
    of_capability = [x for x in cert["tests"] if x["tier"] == tier and x.get("capabilities")]
    if t["passed"] == 0 or (
        of_capability and all(x["outcome"] == "skipped" for x in of_capability)
    ):
        return "absent"
    if t.get("tokens_expected"):  # T6: the greedy tokens reproduced
        return f"certified ({t['tokens_reproduced']} of {t['tokens_expected']} tokens)"
    return f"certified ({t['passed']} passed)"


def _capability_cell(cert: dict[str, Any], cap: str) -> str:
    c = cert["capabilities"].get(cap, {"state": "not certified", "why": "not declared"})
    if cap not in cert["backend"]["capabilities_declared"]:
        return "absent"
    if c["state"] == "failed":
        return _first([x for x in _failed(cert) if cap in (x.get("capabilities") or [])])
    return str(c["state"]) + ("" if c["state"] == "certified" else f" ({c['why']})")


def _worst_cell(cert: dict[str, Any], tier: str) -> str:
    """The tier's worst measured figure against its tolerance (passed and failed tests
    alike), or the exact tiers' mismatch count."""
    t = cert["tiers"].get(tier) or {}
    w = t.get("worst")
    if w:
        return f"{w['figure']} {_num(w['value'])} / {_num(w['tolerance'])}"
    if t.get("mismatches") is not None and t.get("passed"):
        return f"exact: {t['mismatches']} mismatched"
    return "-"


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


Test = dict[str, Any]


def _deviations(cert: dict[str, Any]) -> tuple[list[tuple[Deviation, list[Test]]], list[Test]]:
    """The certificate's failed tests filed under their deviations (in the order of their
    first failure), and those no deviation explains."""
    found: dict[str, tuple[Deviation, list[Test]]] = {}
    unclassified: list[Test] = []
    for t in _failed(cert):
        d = classify(t.get("message") or "", t["nodeid"], cert["backend"]["name"])
        if d is None:
            unclassified.append(t)
        else:
            found.setdefault(d.key, (d, []))[1].append(t)
    return list(found.values()), unclassified


def _bound_used(tests: list[Test], key: str) -> float | None:
    """The largest fraction of deviation ``key``'s bound that a failing case of ``tests``
    used (the suite's ``bound_used`` figure, T7's row-parallel sums from spec 1.5), or
    ``None`` where no case measured one."""
    fractions = [
        float(c["bound_used"][key])
        for t in tests
        for c in t.get("cases") or []
        if key in (c.get("bound_used") or {})
    ]
    return max(fractions) if fractions else None


def engine_verdict(cert: dict[str, Any]) -> dict[str, Any]:
    """The class of an engine's certificate (spec 1.2): every failed test explained
    by the suite's emulation (``explained_by``, certificate schema 4) or, where the suite
    has no emulation, by the message of a declared deviation
    (:func:`nvfp4_engines.deviations.classify`) that the registry of the certificate's spec
    version holds (1.2's for 1.2-1.4); ``incompatible`` when a failure is unexplained or an
    explaining deviation is ``unsafe``."""
    spec = cert.get("spec_version")
    held = {d.id for d in registry.deviations(spec)}
    claimed: dict[str, int] = {}
    by = {"emulation": 0, "message": 0}
    unexplained: list[str] = []
    for t in _failed(cert):
        ids = t.get("explained_by")
        if ids:
            by["emulation"] += 1
        else:
            d = classify(t.get("message") or "", t["nodeid"], cert["backend"]["name"])
            ids = [d.key] if d is not None and d.key in held else []
            by["message"] += bool(ids)
        if not ids:
            unexplained.append(t["nodeid"])
        for i in ids:
            claimed[i] = claimed.get(i, 0) + 1
    unsafe = [i for i in claimed if not registry.deviation(i, spec).admissible]
    if not claimed and not unexplained and cert["result"] != "failed":
        cls = "conformant"
    elif unexplained or unsafe or not claimed:
        cls = "incompatible"
    else:
        cls = "compatible"
    return {
        "class": cls,
        "claimed": claimed,
        "unexplained": unexplained,
        "unsafe": unsafe,
        "by": by,
    }


def _impact_cell(ids: Iterable[str], impact: dict[str, Any]) -> str:
    """The measured T6 impact of the real-checkpoint deviations among ``ids``."""
    cells = []
    for i in ids:
        m = (impact.get("deviations") or {}).get(i)
        if m and m.get("kl") is not None:
            cells.append(f"`{i}`: {m['tokens']}/{m.get('of', 160)} tokens, KL {m['kl']:.2g}")
    return "; ".join(cells) or "-"


def _meaning(v: dict[str, Any], impact: dict[str, Any]) -> str:
    if v["class"] == "conformant":
        return "computes what the spec says, bit for bit where it is exact"
    parts = []
    if v["unsafe"]:
        bounds = "; ".join(registry.deviation(i).bound_text for i in v["unsafe"])
        parts.append(f"unsafe: {bounds}")
    if v["unexplained"]:
        parts.append(
            f"{len(v['unexplained'])} failing test(s) no declared deviation explains: "
            "treat as bugs until explained"
        )
    if v["class"] == "compatible":
        real = [i for i in v["claimed"] if registry.deviation(i).scope == "real"]
        worst = [
            (impact.get("deviations") or {}).get(i, {}).get("tokens")
            for i in real
            if (impact.get("deviations") or {}).get(i, {}).get("kl") is not None
        ]
        tail = f"; T6: {min(worst)}/160 tokens at worst" if worst else ""
        parts.append("every difference is a declared deviation within its bound" + tail)
    return "; ".join(parts)


def _verdict_section(certs: list[dict[str, Any]], impact: dict[str, Any]) -> list[str]:
    lines = [
        "## Verdicts",
        "",
        'The class of each engine (spec 1.2, "Conformance classes and declared '
        'deviations"): **conformant**: every test passes; **compatible**: every failing '
        "test is explained by a declared deviation of the registry of the certified spec "
        "version (`spec/1.5/deviations.toml`; 1.2's for 1.2-1.4) that is "
        "not `unsafe`; **incompatible**: a failure no declared deviation explains, or one "
        "only an `unsafe` deviation explains. A failing test is explained by **emulation** "
        "when the suite's reference with that deviation (`nvfp4.deviation_emulators`) "
        "gives exactly the engine's output, or every element is within the bound of a "
        "`partials_relative` one (certificate schema 4, `explained_by`), else by "
        "**message** when its failure message is the one the deviation's reading predicts "
        "(`nvfp4_engines.deviations`). **Real checkpoints**: the deviation changes what "
        "real weights or models compute; **malformed input**: only NaN / Inf, all-zero or "
        "subnormal tensors, or out-of-range ids meet it. The T6 impact "
        "(`reports/deviation-impact.json`, `tools/measure_deviation_impact.py`) is the "
        "T6 model's greedy tokens matching the reference's of 160 and the mean KL when "
        "its weights are encoded / decoded with that deviation alone; "
        '[deviation-impact.md](deviation-impact.md) answers "can I quantize with X and '
        'serve with Y" from the same measurements. Each bug that makes an engine '
        "incompatible has a drafted upstream report with a standalone reproducer in "
        "[upstream/README.md](upstream/README.md).",
        "",
    ]
    rows = []
    for c in certs:
        v = engine_verdict(c)
        claimed = ", ".join(
            f"`{i}` ({registry.deviation(i).severity}, {n})" for i, n in v["claimed"].items()
        )
        how = f"{v['by']['emulation']} by emulation, {v['by']['message']} by message"
        if "verdict" not in c:
            how += " (certificate schema " + str(c["schema_version"]) + ": no emulation)"
        rows.append(
            [
                f"`{c['backend']['name']}`",
                engine_of(c),
                f"**{v['class']}**",
                claimed or "-",
                f"{len(v['unexplained'])}; {how}",
                _impact_cell(v["claimed"], impact),
                _meaning(v, impact),
            ]
        )
    done = {c["backend"]["name"] for c in certs}
    for name in GPU_ADAPTERS:
        if name not in done:
            rows.append(
                [
                    f"`{name}`",
                    "-",
                    "not run: needs CUDA",
                    "-",
                    "-",
                    "-",
                    "its adapter exists; `benchmarks/gpu/run.sh` certifies it on a GPU",
                ]
            )
    lines += _table(
        [
            "adapter",
            "engine",
            "class",
            "deviations claimed (severity, failing tests)",
            "unexplained; how explained",
            "T6 impact",
            "what this means",
        ],
        rows,
    )
    return [*lines, ""]


def _interchange_section(impact: dict[str, Any]) -> list[str]:
    """The quantizer x server table of the impact report (T6 tokens of 160 and KL), or
    nothing where the report has none."""
    rows_in = impact.get("interchange") or []
    if not rows_in:
        return []
    producers = list(dict.fromkeys(r["producer"] for r in rows_in))
    consumers = list(dict.fromkeys(r["consumer"] for r in rows_in))
    cell = {(r["producer"], r["consumer"]): r for r in rows_in}
    rows = [
        [p]
        + [
            f"{cell[p, c]['tokens']}/{cell[p, c]['of']}, KL {cell[p, c]['kl']:.2g}"
            if (p, c) in cell
            else "-"
            for c in consumers
        ]
        for p in producers
    ]
    return [
        "## Quantize with X, serve with Y",
        "",
        "The T6 model's weights quantized with each quantizer's declared encoder deviations "
        "and decoded with each server's declared decoder deviations (emulated by the "
        "reference, W4A16): greedy tokens matching the reference of 160 and mean KL; "
        "[deviation-impact.md](deviation-impact.md) has the details.",
        "",
        *_table(["quantized with \\ served by", *consumers], rows),
        "",
    ]


def render(
    certs: list[dict[str, Any]],
    whole: list[dict[str, Any]] | None = None,
    impact: dict[str, Any] | None = None,
) -> str:
    """The Markdown of ``docs/engines.md`` for these certificates and the whole-model
    results ``whole`` (:mod:`.whole_model.results`: a section after the runs)."""
    lines = [
        "# NVFP4 engines: conformance matrix",
        "",
        "<!-- Generated by `python -m nvfp4_engines.matrix render` from the certificates in",
        "     reports/engines/; do not edit by hand. -->",
        "",
        "Each row is a third-party NVFP4 implementation, certified by the conformance suite "
        "through its adapter in `packages/nvfp4-engines` (the adapter calls only the "
        "engine's own functions; what the engine lacks is absent, never filled in). "
        "**certified**: every test that ran passed; **failed**: the first failing test and "
        "how many failed; **absent**: the engine has nothing the tier or capability tests; "
        "**not run**: left out of the run.",
        "",
        *_verdict_section(certs, impact or {}),
        *_interchange_section(impact or {}),
        "## Tiers",
        "",
    ]
    rows = []
    for c in certs:
        rows.append(
            [f"`{c['backend']['name']}`", engine_of(c), c["spec_version"], c["result"]]
            + [_tier_cell(c, t) for t in TIERS]
        )
    lines += _table(["adapter", "engine", "spec", "result", *TIERS], rows)
    lines += ["", "## Capabilities", ""]
    rows = [
        [f"`{c['backend']['name']}`", engine_of(c)] + [_capability_cell(c, k) for k in CAPABILITIES]
        for c in certs
    ]
    lines += _table(["adapter", "engine", *CAPABILITIES], rows)
    lines += [
        "",
        "## Worst measured errors",
        "",
        "Per tier, over every case that ran (failed ones included): the figure, its value and "
        "its tolerance.",
        "",
    ]
    rows = [
        [f"`{c['backend']['name']}`"] + [_worst_cell(c, t) for t in MEASURED_TIERS] for c in certs
    ]
    lines += _table(["adapter", *MEASURED_TIERS], rows)
    lines += ["", "## Runs", ""]
    rows = [
        [
            f"`{c['backend']['name']}`",
            str(c.get("device") or "-"),
            ", ".join(f"{v} {k}" for k, v in sorted(c["summary"].items())),
            f"{c['duration_s']:.1f} s",
            "; ".join(f"{x['tier']} {x['reason']}" for x in c.get("left_out") or []) or "-",
        ]
        for c in certs
    ]
    lines += _table(["adapter", "device", "tests", "time", "left out"], rows)
    if whole:
        lines += ["", *whole_model.markdown(whole)]
    lines += ["", "## Deviations found", ""]
    for c in certs:
        name = c["backend"]["name"]
        found, unclassified = _deviations(c)
        if not found and not unclassified:
            continue
        lines += [f"### `{name}` ({engine_of(c)})", ""]
        for d, tests in found:
            used = _bound_used(tests, d.key)
            within = "" if used is None else f"; the worst uses {used:.2g} of its bound"
            lines += [
                f"**{d.key}** - {len(tests)} failed test{'s' if len(tests) > 1 else ''}, first "
                f"`{tests[0]['nodeid'].split('::', 1)[-1]}`{within}.",
                "",
                f"- Spec rule: {d.rule}.",
                f"- Reading: {d.reading}.",
                "",
            ]
            code = d.reproducers.get(name)
            if code:
                lines += ["```python", code.rstrip(), "```", ""]
        for t in unclassified:
            msg = (t.get("message") or "").splitlines()[0][:300]
            if msg.startswith("ExceptionGroup: Hypothesis found"):
                msg += " (the certificate keeps only this line: run the test alone to see each)"
            lines += [f"- unclassified: `{t['nodeid']}`: {msg}", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4_engines.matrix")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="copy certificates into the reports folder")
    rec.add_argument("certificates", nargs="+", type=Path)
    rec.add_argument("--out", type=Path, default=Path("reports/engines"))
    rec.add_argument("--root", type=Path, default=Path.cwd())
    ren = sub.add_parser("render", help="write docs/engines.md from the certificates")
    ren.add_argument("--reports", type=Path, default=Path("reports/engines"))
    ren.add_argument("--out", type=Path, default=Path("docs/engines.md"))
    ren.add_argument("--check", action="store_true", help="fail if --out differs")
    args = parser.parse_args(argv)
    if args.command == "record":
        for p in record(args.certificates, args.out, args.root.resolve()):
            print(f"recorded {p}")
        return 0
    impact_file = args.reports.parent / IMPACT
    impact = json.loads(impact_file.read_text()) if impact_file.is_file() else None
    text = render(
        load_certificates(args.reports),
        whole_model.load_all(args.reports / whole_model.FOLDER),
        impact,
    )
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is not what {args.reports} gives: re-run render", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
