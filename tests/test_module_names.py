"""No module of the packages is named like a standard-library module.

A module named ``numbers`` inside a package is reachable as ``pkg.numbers`` only, yet a
reader (and a tool run from the package's folder, where the folder is on ``sys.path``) takes
it for the standard library's. Names say what the module is instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shadowing(paths: list[Path]) -> list[str]:
    """The paths among ``paths`` whose module or package name is a standard-library one."""
    found = []
    for path in paths:
        name = path.parent.name if path.name == "__init__.py" else path.stem
        if name in sys.stdlib_module_names:
            found.append(str(path.relative_to(ROOT)))
    return found


def test_no_module_shadows_the_standard_library() -> None:
    sources = sorted(ROOT.glob("packages/*/src/**/*.py")) + sorted(
        ROOT.glob("conformance/src/**/*.py")
    )
    assert len(sources) > 50, "expected the packages' sources"
    assert shadowing(sources) == []


def test_the_check_sees_a_shadowing_module() -> None:
    pkg = ROOT / "conformance" / "src" / "nvfp4_conformance"
    assert shadowing([pkg / "numbers.py", pkg / "typing" / "__init__.py", pkg / "plugin.py"]) == [
        "conformance/src/nvfp4_conformance/numbers.py",
        "conformance/src/nvfp4_conformance/typing/__init__.py",
    ]
