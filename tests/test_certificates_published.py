"""The certificates published under ``docs/certificates/`` are current and readable.

A published certificate is stale when the tree it describes has moved on: the suite, core or
the backend now carries another version, the suite writes another certificate schema, or the
backend certified no longer names the spec version the certificate is for. Each check below
names the file, the field, what the tree says and what the certificate says; the fix is
``nox -s conformance certificates`` (``tools/publish_certificates.py``). README's excerpt
must be the start of the published cpu certificate, as the tool writes it.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "certificates"
sys.path.insert(0, str(ROOT / "tools"))
import publish_certificates  # noqa: E402

sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

#: Where a distribution's version is written (``_version.py`` of its import package).
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def tree_version(distribution: str) -> str:
    """The version the tree's ``distribution`` carries now."""
    folder = (
        ROOT / "conformance"
        if distribution == "nvfp4-conformance"
        else ROOT / "packages" / distribution
    )
    (version_file,) = folder.glob("src/*/_version.py")
    found = _VERSION.search(version_file.read_text(encoding="utf-8"))
    assert found, f"{version_file}: no __version__ line"
    return found.group(1)


def schema_version() -> int:
    tree = ast.parse((ROOT / "conformance/src/nvfp4_conformance/certificate_schema.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SCHEMA_VERSION":
            return int(ast.literal_eval(node.value))
    raise AssertionError("certificate_schema.py: no SCHEMA_VERSION")


def released_specs() -> list[str]:
    return sorted(
        (p.name for p in (ROOT / "spec").iterdir() if re.fullmatch(r"\d+\.\d+", p.name)),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )


CERTIFICATES = sorted(PUBLISHED.glob("conformance-*.json"))


def test_every_backend_ci_certifies_is_published() -> None:
    expected = {f"conformance-{hw}.json" for hw in noxfile.HARDWARE}
    assert expected <= {p.name for p in CERTIFICATES}, sorted(expected)


def staleness(cert: dict, name: str) -> list[str]:
    """Where ``cert`` no longer describes the tree: one line per field."""
    stale = []

    def same(field: str, tree: object, recorded: object) -> None:
        if tree != recorded:
            stale.append(f"{name}: {field}: the tree says {tree!r}, the certificate {recorded!r}")

    same("schema_version", schema_version(), cert.get("schema_version"))
    same("suite.version", tree_version("nvfp4-conformance"), cert["suite"]["version"])
    same("core.version", tree_version("nvfp4-core"), cert["core"]["version"])
    backend = cert["backend"]
    same("backend.version", tree_version(backend["package"]), backend["version"])
    newest = [v for v in released_specs() if v in backend["spec_versions"]]
    same("spec_version (newest released the backend names)", newest[-1:], [cert["spec_version"]])
    for key, where in (cert.get("imported_from") or {}).items():
        if str(where).startswith("/"):
            stale.append(f"{name}: imported_from.{key} is a machine path: {where}")
    return stale


@pytest.mark.parametrize("path", CERTIFICATES, ids=lambda p: p.stem)
def test_a_published_certificate_matches_the_tree(path: Path) -> None:
    cert = json.loads(path.read_text(encoding="utf-8"))
    stale = staleness(cert, str(path.relative_to(ROOT)))
    assert not stale, "stale; run `nox -s conformance certificates`:\n" + "\n".join(stale)


@pytest.mark.parametrize("path", CERTIFICATES, ids=lambda p: p.stem)
def test_the_markdown_twin_says_the_same_result(path: Path) -> None:
    cert = json.loads(path.read_text(encoding="utf-8"))
    twin = path.with_suffix(".md")
    assert twin.is_file(), f"{twin.relative_to(ROOT)} is missing"
    text = twin.read_text(encoding="utf-8")
    assert f"**Result: {cert['result'].upper()}**" in text
    assert f"Backend `{cert['backend']['name']}` {cert['backend']['version']}" in text


def test_the_readme_excerpt_is_the_cpu_certificate() -> None:
    assert publish_certificates.main(["--check"]) == 0, (
        "README.md's certificate excerpt differs from docs/certificates/conformance-cpu.md: "
        "run `python tools/publish_certificates.py`"
    )


def test_the_checks_can_fail() -> None:
    """An older suite version, another schema and a machine path are each found; an excerpt
    that differs from its source is found."""
    (source,) = [p for p in CERTIFICATES if p.stem == "conformance-cpu"]
    cert = json.loads(source.read_text(encoding="utf-8"))
    cert["suite"]["version"] = "0.0.1"
    cert["schema_version"] = 1
    cert["imported_from"]["backend"] = "/opt/x/site-packages/nvfp4_cpu/backend.py"
    assert len(staleness(cert, "c.json")) == 3
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    markdown = source.with_suffix(".md").read_text(encoding="utf-8")
    changed = markdown.replace("**Result:", "**Result: was", 1)
    assert publish_certificates.readme_with_excerpt(readme, changed) != readme
    assert publish_certificates.placeable("/x/y/lib/site-packages/nvfp4/__init__.py") == (
        "site-packages/nvfp4/__init__.py"
    )


#: READMEs that quote an interpreter certification's counts ("N passed, M skipped"), and the
#: published certificate they quote.
QUOTED_COUNTS = {
    "packages/nvfp4-cuda/README.md": "conformance-cuda.json",
    "packages/nvfp4-rocm/README.md": "conformance-rocm.json",
}


@pytest.mark.parametrize("readme", sorted(QUOTED_COUNTS))
def test_readme_counts_are_the_published_certificates(readme: str) -> None:
    cert = json.loads((PUBLISHED / QUOTED_COUNTS[readme]).read_text(encoding="utf-8"))
    text = (ROOT / readme).read_text(encoding="utf-8").replace("\n", " ")
    m = re.search(
        r"Conformance T0-T5 under the interpreter[^:]*: (\d+) passed, (\d+) skipped", text
    )
    assert m, f"{readme}: no 'Conformance T0-T5 under the interpreter ...: N passed, M skipped'"
    said = (int(m.group(1)), int(m.group(2)))
    summary = cert["summary"]
    assert said == (summary.get("passed", 0), summary.get("skipped", 0)), (
        f"{readme} says {said[0]} passed, {said[1]} skipped; docs/certificates/"
        f"{QUOTED_COUNTS[readme]} says {summary}"
    )
