"""Every backend names the spec versions it is certified for as literals.

A backend that passed ``nvfp4.SUPPORTED_SPEC_VERSIONS`` into its ``BackendInfo`` would claim
every version a newer nvfp4-core adds, without a conformance run against it. This reads the
sources (no import, so it holds for backends whose hardware or engine is absent here):

* no module of a package's ``src/`` that builds a ``BackendInfo`` mentions
  ``SUPPORTED_SPEC_VERSIONS`` in code (comments may);
* every ``spec_versions=`` of a ``BackendInfo(...)`` is a tuple of string literals or a name
  (``SPEC_VERSIONS``, ``self.SPEC_VERSIONS``), and every ``SPEC_VERSIONS`` assigned in a
  ``src/`` is a tuple of string literals;
* every package that registers a backend (entry point group ``nvfp4.backends``) names its
  ``SPEC_VERSIONS``, or sets every ``spec_versions=`` to a literal.

``packages/nvfp4-core/tests/test_registry.py`` checks the other half at run time: no
installed backend claims a version nvfp4-core has not released.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = "SUPPORTED_SPEC_VERSIONS"


def _sources() -> list[Path]:
    return sorted(ROOT.glob("packages/*/src/**/*.py")) + sorted(
        ROOT.glob("conformance/src/**/*.py")
    )


def _is_literal_versions(node: ast.expr) -> bool:
    return isinstance(node, ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    )


def _backend_info_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Name) and n.func.id == "BackendInfo")
            or (isinstance(n.func, ast.Attribute) and n.func.attr == "BackendInfo")
        )
    ]


def _mentions(tree: ast.AST, name: str) -> list[int]:
    lines = []
    for n in ast.walk(tree):
        if (
            (isinstance(n, ast.Name) and n.id == name)
            or (isinstance(n, ast.Attribute) and n.attr == name)
            or (isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names))
        ):
            lines.append(n.lineno)
    return lines


def _spec_versions_assignments(tree: ast.AST) -> list[tuple[int, ast.expr]]:
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            targets, value = n.targets, n.value
        elif isinstance(n, ast.AnnAssign) and n.value is not None:
            targets, value = [n.target], n.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "SPEC_VERSIONS" for t in targets):
            found.append((n.lineno, value))
    return found


def _pins(path: Path, root: Path = ROOT) -> tuple[list[str], bool]:
    """(problems, whether the file pins versions) of one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(root)
    problems = []
    calls = _backend_info_calls(tree)
    pinned = False
    if calls:
        problems += [
            f"{rel}:{line}: a backend module uses {FORBIDDEN}"
            for line in _mentions(tree, FORBIDDEN)
        ]
    for call in calls:
        for kw in call.keywords:
            if kw.arg != "spec_versions":
                continue
            value = kw.value
            if _is_literal_versions(value):
                pinned = True
            elif not (
                (isinstance(value, ast.Name) and value.id == "SPEC_VERSIONS")
                or (isinstance(value, ast.Attribute) and value.attr == "SPEC_VERSIONS")
            ):
                problems.append(
                    f"{rel}:{call.lineno}: spec_versions= {ast.unparse(value)}, expected a "
                    "tuple of literals or SPEC_VERSIONS"
                )
    for line, value in _spec_versions_assignments(tree):
        if _is_literal_versions(value):
            pinned = True
        else:
            problems.append(f"{rel}:{line}: SPEC_VERSIONS = {ast.unparse(value)}, not literals")
    return problems, pinned


def test_no_backend_claims_every_version_of_the_installed_core() -> None:
    problems = [p for path in _sources() for p in _pins(path)[0]]
    assert not problems, "\n".join(problems)


def test_every_registered_backend_names_its_versions() -> None:
    packages = []
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        if "nvfp4.backends" in project.get("entry-points", {}):
            packages.append(pyproject.parent)
    assert len(packages) >= 6, f"expected the backend packages, found {packages}"
    unpinned = [
        p.name for p in packages if not any(_pins(f)[1] for f in sorted(p.glob("src/**/*.py")))
    ]
    assert not unpinned, f"packages registering a backend without SPEC_VERSIONS: {unpinned}"


def test_the_check_catches_a_wholesale_claim(tmp_path: Path) -> None:
    bad = tmp_path / "backend.py"
    bad.write_text(
        "from nvfp4.spec import SUPPORTED_SPEC_VERSIONS\n"
        "import nvfp4\n"
        "SPEC_VERSIONS = tuple(nvfp4.SUPPORTED_SPEC_VERSIONS)\n"
        "a = BackendInfo(name='a', spec_versions=SUPPORTED_SPEC_VERSIONS)\n"
        "b = BackendInfo(name='b', spec_versions=SPEC_VERSIONS)\n"
    )
    problems, pinned = _pins(bad, tmp_path)
    assert not pinned
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        f"backend.py:{n}" for n in (1, 3, 3, 4, 4)
    ]
    good = tmp_path / "good.py"
    good.write_text(
        "# not nvfp4.SUPPORTED_SPEC_VERSIONS\n"
        "SPEC_VERSIONS = ('1.0', '1.1')\n"
        "b = BackendInfo(name='b', spec_versions=SPEC_VERSIONS)\n"
    )
    assert _pins(good, tmp_path) == ([], True)
