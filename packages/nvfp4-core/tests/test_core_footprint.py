"""nvfp4-core is the standard in code and nothing more: numpy and ml_dtypes at run time
(and tomli on Python 3.10, to read the spec's tolerance files), no checkpoint tooling (that is nvfp4-checkpoints), no safetensors or gguf imported."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: What `pip install nvfp4-core` may pull, and nothing else.
RUNTIME_DEPENDENCIES = {"numpy", "ml_dtypes"}
#: ... and where Python lacks `tomllib` (3.10), its backport, to read spec/<X.Y>/tolerances.toml.
PY310_DEPENDENCIES = {"tomli": "python_version < '3.11'"}
#: Modules `import nvfp4` must not load: the checkpoint tooling and its file libraries.
FOREIGN = ("nvfp4_checkpoints", "nvfp4.checkpoint", "nvfp4.cli", "safetensors", "gguf")


def _name(requirement: str) -> str:
    return re.split(r"[ <>=!~;\[]", requirement, maxsplit=1)[0].strip()


def test_runtime_dependencies_are_numpy_and_ml_dtypes_only() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    unconditional = {_name(r) for r in project["dependencies"] if ";" not in r}
    assert unconditional == RUNTIME_DEPENDENCIES
    markers = {_name(r): r.split(";", 1)[1].strip() for r in project["dependencies"] if ";" in r}
    assert markers == PY310_DEPENDENCIES
    assert "scripts" not in project, "the `nvfp4` command belongs to nvfp4-checkpoints"
    assert set(project.get("optional-dependencies", {})) == {"test"}


def _modules_after(code: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    loaded: list[str] = json.loads(r.stdout.splitlines()[-1])
    return loaded


def test_import_nvfp4_loads_no_checkpoint_code() -> None:
    loaded = _modules_after("import nvfp4, nvfp4.fixtures, nvfp4.layouts")
    foreign = [m for m in loaded if m.startswith(FOREIGN)]
    assert foreign == [], f"import nvfp4 loaded {foreign}"


def test_golden_fixtures_load_without_the_safetensors_package() -> None:
    # A None entry makes `import safetensors` fail, as on an install without it.
    loaded = _modules_after(
        "import sys; sys.modules['safetensors'] = None\n"
        "from nvfp4.fixtures import list_cases, load_case\n"
        "for case in list_cases(): load_case(case['name'])"
    )
    assert [m for m in loaded if m.startswith(FOREIGN) and m != "safetensors"] == []


#: Top-level packages no module of nvfp4-core may import, at module level or inside a
#: function: the frameworks (nvfp4-torch and nvfp4-metal integrate them) and the file
#: libraries (nvfp4-checkpoints reads and writes files).
FORBIDDEN_IMPORTS = {"torch", "mlx", "safetensors", "gguf", "transformers", "nvfp4_checkpoints"}


def _imported_tops(path: Path) -> set[str]:
    import ast

    tops: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_no_module_of_core_imports_a_framework_or_a_file_library() -> None:
    """Every module of the package is read with ``ast`` (imports inside functions count):
    none imports torch, mlx, safetensors, gguf, transformers or nvfp4-checkpoints. The
    deprecated aliases (``nvfp4.torch_ops``) reach nvfp4-torch by name at run time only."""
    src = PYPROJECT.parent / "src"
    found = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        bad = _imported_tops(path) & FORBIDDEN_IMPORTS
        if bad:
            found[rel] = sorted(bad)
    assert found == {}, f"nvfp4-core modules import {found}"
    assert len(list(src.rglob("*.py"))) > 30  # the walk saw the package
