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
