"""The repository's Markdown says what is there and renders as written.

* Every repository path a document names in backticks (``packages/x/y.py``, a module path
  such as ``nvfp4_cuda/dispatch.py`` inside a package's ``src/``, or a path relative to the
  document) exists; outputs that scripts and sessions write (``reports/``, ``dist/``,
  ``benchmarks/results/``, ``docs/benchmark_results/``) are left out.
* No table is cut in two by a blank line: a ``|`` row after a blank line must start a new
  table (a header followed by its ``|---|`` separator), else it renders as plain text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where documents live (generated run logs under docs/benchmark_results are not prose).
DOCUMENTS = sorted(
    p
    for pattern in ("*.md", "packages/*/*.md", "conformance/*.md", "spec/**/*.md", "docs/**/*.md")
    for p in ROOT.glob(pattern)
    if ".nox" not in p.parts
)
#: Folders that hold what scripts and sessions write, not committed sources.
WRITTEN = ("reports/", "dist/", "benchmarks/results/", "docs/benchmark_results/", "X.Y/")
_PATH = re.compile(
    r"`((?:\.\./|\./)?[\w.-]+(?:/[\w.-]+)+\.(?:py|md|toml|json|sh|c|h|yml|yaml|txt|schema\.json))`"
)
_SOURCES = [*ROOT.glob("packages/*/src"), ROOT / "conformance" / "src", *ROOT.glob("*/*/src/*")]


def _exists(path: str, document: Path) -> bool:
    bases = [ROOT, document.parent, *ROOT.glob("packages/*"), *_SOURCES]
    return any((base / path).exists() for base in bases)


def test_documents_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {"README.md", "conformance/README.md", "docs/architecture.md"} <= names


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_path_exists(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    missing = sorted(
        {
            m.group(1)
            for m in _PATH.finditer(text)
            if not m.group(1).startswith(WRITTEN) and not _exists(m.group(1), document)
        }
    )
    assert not missing, f"{document.relative_to(ROOT)} names paths that do not exist: {missing}"


def split_tables(text: str) -> list[int]:
    """1-based numbers of the blank lines that cut a table in two."""
    lines = text.split("\n")
    found = []
    for i in range(1, len(lines) - 1):
        if lines[i].strip() or not lines[i - 1].lstrip().startswith("|"):
            continue
        if not lines[i + 1].lstrip().startswith("|"):
            continue
        following = lines[i + 2].strip() if i + 2 < len(lines) else ""
        if not re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", following):
            found.append(i + 1)
    return found


def test_the_split_table_check_can_fail() -> None:
    assert split_tables("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n") == [4]
    assert split_tables("| a |\n|---|\n| 1 |\n\n| b |\n|---|\n| 2 |\n") == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_table_is_split_by_a_blank_line(document: Path) -> None:
    cut = split_tables(document.read_text(encoding="utf-8"))
    assert not cut, f"{document.relative_to(ROOT)}: a blank line splits a table at line(s) {cut}"


def _long_descriptions() -> list[Path]:
    """The README each distribution publishes as its long description."""
    import tomllib

    found = []
    for pyproject in [
        *ROOT.glob("packages/*/pyproject.toml"),
        ROOT / "conformance" / "pyproject.toml",
    ]:
        readme = tomllib.loads(pyproject.read_text())["project"].get("readme")
        assert isinstance(readme, str), f"{pyproject}: project.readme should name a file"
        found.append(pyproject.parent / readme)
    return found


#: A Markdown link whose target is a file beside the document: it breaks on a package
#: index's page, where only the README itself is shown.
_RELATIVE_LINK = re.compile(
    r"\]\((?!#)(?![a-z]+:)[^)\s]+\)|^\[[^\]\n]+\]:[ \t]*(?!#)(?![a-z]+:)\S+", re.M
)


def test_the_relative_link_check_can_fail() -> None:
    assert _RELATIVE_LINK.search("see [core](../nvfp4-core) here")
    assert _RELATIVE_LINK.search("[x]: docs/a.md")
    assert not _RELATIVE_LINK.search("see [the table](#verbs) and `../nvfp4-core`")


@pytest.mark.parametrize("readme", _long_descriptions(), ids=lambda p: p.parent.name)
def test_long_descriptions_have_no_relative_links(readme: Path) -> None:
    links = [m.group(0) for m in _RELATIVE_LINK.finditer(readme.read_text(encoding="utf-8"))]
    assert not links, f"{readme.relative_to(ROOT)} (a package's long description) links {links}"
