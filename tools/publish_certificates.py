"""Publish the conformance certificates CI produced: ``reports/conformance-<backend>.json`` and
their Markdown twins go to ``docs/certificates/``, with an index, and README's certificate
excerpt is replaced by the start of the cpu backend's.

Run it after the conformance sessions (``nox -s conformance certificates`` does both). What it
changes in the certificates: the module paths under ``imported_from`` (absolute paths of the
machine that ran them) are cut to the part a reader can place, from ``site-packages/`` or from
the package folder on; nothing else. ``tests/test_certificates_published.py`` fails when a
published certificate no longer matches the tree's versions, or README's excerpt its source.

Usage: ``python tools/publish_certificates.py [REPORTS] [--check]`` (``--check``: change
nothing, exit 1 when README's excerpt differs from what would be written).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "certificates"
README = ROOT / "README.md"
#: README's excerpt lies between these two lines (kept).
EXCERPT_START = (
    "<!-- excerpt: docs/certificates/conformance-cpu.md (tools/publish_certificates.py) -->"
)
EXCERPT_END = "<!-- end of excerpt -->"
EXCERPT_SOURCE = "conformance-cpu.md"


def placeable(path: str) -> str:
    """An absolute module path cut to what a reader can place: from ``site-packages/``, or
    from the package folder of this tree (``packages/...``, ``conformance/...``)."""
    for marker in ("site-packages/", "packages/", "conformance/"):
        at = path.find(marker)
        if at >= 0:
            return path[at:]
    return Path(path).name


def publish_one(json_path: Path, target: Path) -> tuple[Path, dict]:
    """Copy one certificate (JSON and Markdown twin) into ``target`` with its module paths
    cut; returns the published JSON's path and its content."""
    cert = json.loads(json_path.read_text(encoding="utf-8"))
    markdown_path = json_path.with_suffix(".md")
    if not markdown_path.is_file():
        raise SystemExit(f"{json_path}: its Markdown twin {markdown_path.name} is missing")
    markdown = markdown_path.read_text(encoding="utf-8")
    for key, path in sorted((cert.get("imported_from") or {}).items()):
        if isinstance(path, str) and path:
            short = placeable(path)
            cert["imported_from"][key] = short
            markdown = markdown.replace(path, short)
    out = target / json_path.name
    out.write_text(json.dumps(cert, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    (target / markdown_path.name).write_text(markdown, encoding="utf-8")
    return out, cert


def index(certs: list[tuple[Path, dict]]) -> str:
    lines = [
        "# Published conformance certificates",
        "",
        "The certificates of the latest CI run, one per backend CI can run (the JSON and its",
        "one-screen Markdown twin), published by `tools/publish_certificates.py`; a repository",
        "test fails when one no longer matches the tree's versions. Engines' certificates are",
        "under `reports/engines/` (see `docs/engines.md`).",
        "",
        "| backend | result | tests passed | spec | backend version | device | recorded |",
        "|---|---|--:|---|---|---|---|",
    ]
    for path, cert in certs:
        backend = cert["backend"]
        summary = cert.get("summary", {})
        lines.append(
            f"| [`{backend['name']}`]({path.with_suffix('.md').name}) | {cert['result']} | "
            f"{summary.get('passed', 0)} | {cert['spec_version']} | {backend['version']} | "
            f"{cert.get('device') or '-'} | {_date(cert)} |"
        )
    return "\n".join(lines) + "\n"


def _date(cert: dict) -> str:
    import time

    started = cert.get("started_unix")
    return time.strftime("%Y-%m-%d", time.gmtime(started)) if started else "-"


def excerpt(markdown: str) -> str:
    """The one-screen start of a certificate: from the result line to the end of the tier
    table."""
    lines = markdown.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("**Result:"))
    table = next(i for i in range(start, len(lines)) if lines[i].startswith("| tier |"))
    end = next((i for i in range(table, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def readme_with_excerpt(readme: str, markdown: str) -> str:
    head, found, rest = readme.partition(EXCERPT_START + "\n")
    if not found or EXCERPT_END not in rest:
        raise SystemExit(f"README.md: no {EXCERPT_START!r} ... {EXCERPT_END!r} block")
    tail = rest.split(EXCERPT_END, 1)[1]
    return f"{head}{EXCERPT_START}\n```text\n{excerpt(markdown)}\n```\n{EXCERPT_END}{tail}"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if check:
        source = (TARGET / EXCERPT_SOURCE).read_text(encoding="utf-8")
        current = README.read_text(encoding="utf-8")
        return 0 if readme_with_excerpt(current, source) == current else 1
    reports = Path(args[0]) if args else ROOT / "reports"
    found = sorted(reports.glob("conformance-*.json"))
    if not found:
        print(f"{reports}: no conformance-*.json (run the conformance sessions first)")
        return 2
    TARGET.mkdir(parents=True, exist_ok=True)
    published = [publish_one(p, TARGET) for p in found]
    (TARGET / "README.md").write_text(index(published), encoding="utf-8")
    source = TARGET / EXCERPT_SOURCE
    if source.is_file():
        README.write_text(
            readme_with_excerpt(README.read_text(encoding="utf-8"), source.read_text()),
            encoding="utf-8",
        )
    for path, cert in published:
        print(f"{path.relative_to(ROOT)}: {cert['result']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
