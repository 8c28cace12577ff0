"""The boundaries between the repository's packages, read from their sources with ``ast``
(imports inside functions count):

* the conformance suite only certifies: no module of it imports torch or transformers (T6
  loads and decodes its model through nvfp4-torch);
* nvfp4-engines takes from the suite only its public names (the package's ``__all__``: the
  T6 golden reader, the suite's spec versions), never a module of its internals;
* no package but nvfp4-torch defines torch modules or registers torch operators;
* the MLX layers live in nvfp4-metal; the one other MLX module class is the model file
  nvfp4-checkpoints writes into MLX folders, which plain mlx-lm imports without nvfp4;
* a backend requires nvfp4-core (the GPU ones nvfp4-triton too) and no other package of
  this tree: reading checkpoints is an extra (``nvfp4-metal[lm]``, ``nvfp4-torch[models]``).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SUITE_SRC = ROOT / "conformance" / "src" / "nvfp4_conformance"
ENGINES_SRC = ROOT / "packages" / "nvfp4-engines" / "src" / "nvfp4_engines"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in a file (``names`` empty for ``import m``)."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def _public_names(init: Path) -> set[str]:
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{init} has no __all__")


def test_the_suite_imports_no_model_framework() -> None:
    found = {
        str(path.relative_to(ROOT)): sorted(
            {m for m, _ in _imports(path)} & {"torch", "transformers"}
        )
        for path in sorted(SUITE_SRC.rglob("*.py"))
    }
    found = {k: v for k, v in found.items() if v}
    assert found == {}, f"conformance modules import model frameworks: {found}"
    assert not any((SUITE_SRC / n).exists() for n in ("llm.py", "generate.py", "smollm2.py"))


def test_engines_take_only_the_suites_public_names() -> None:
    public = _public_names(SUITE_SRC / "__init__.py")
    bad = []
    seen = 0
    for path in sorted(ENGINES_SRC.rglob("*.py")):
        for module, names in _imports(path):
            if module.split(".")[0] != "nvfp4_conformance":
                continue
            seen += 1
            if module != "nvfp4_conformance" or not set(names) <= public:
                bad.append(f"{path.relative_to(ROOT)}: from {module} import {', '.join(names)}")
    assert bad == [], "nvfp4-engines reaches into the suite's internals:\n" + "\n".join(bad)
    assert seen >= 1  # the whole-model runner reads the T6 golden file


def test_only_nvfp4_torch_defines_torch_modules_and_operators() -> None:
    """``torch.nn.Module`` subclasses and ``torch.library`` operators live in nvfp4-torch
    (the Triton backends' kernels and the engines' adapters call torch, define neither)."""
    bad = []
    for path in sorted([*ROOT.glob("packages/*/src/**/*.py"), *SUITE_SRC.rglob("*.py")]):
        if "nvfp4-torch" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if "torch.library.custom_op" in text or "(torch.nn.Module)" in text:
            bad.append(str(path.relative_to(ROOT)))
    assert bad == [], f"torch modules or operators outside nvfp4-torch: {bad}"


#: The MLX model file nvfp4-checkpoints copies into every MLX folder (plain mlx-lm imports it
#: with ``trust_remote_code``, where nvfp4 may not be installed).
MLX_MODEL_FILE = ROOT / "packages/nvfp4-checkpoints/src/nvfp4_checkpoints/mlx_lm_model.py"


def test_the_mlx_layers_live_in_nvfp4_metal() -> None:
    """Every ``mlx.nn`` module class outside nvfp4-metal is the MLX folders' model file, and
    that file imports mlx and mlx-lm only (it must load where nvfp4 is not installed)."""
    mlx_classes = re.compile(r"^class \w+\((nn\.Module|Module|nn\.Linear|SwitchLinear)\)", re.M)
    outside = []
    for path in sorted([*ROOT.glob("packages/*/src/**/*.py"), *SUITE_SRC.rglob("*.py")]):
        if "nvfp4-metal" in path.parts or "nvfp4-torch" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if "import mlx" in text and mlx_classes.search(text):
            outside.append(path)
    assert outside == [MLX_MODEL_FILE], [str(p.relative_to(ROOT)) for p in outside]
    roots = {module.split(".")[0] for module, _ in _imports(MLX_MODEL_FILE)}
    assert roots <= {"__future__", "re", "typing", "mlx", "mlx_lm"}, roots


BACKENDS = {
    "nvfp4-cpu": {"nvfp4-core"},
    "nvfp4-metal": {"nvfp4-core"},
    "nvfp4-triton": {"nvfp4-core"},
    "nvfp4-cuda": {"nvfp4-core", "nvfp4-triton"},
    "nvfp4-rocm": {"nvfp4-core", "nvfp4-triton"},
}


@pytest.mark.parametrize("package", sorted(BACKENDS))
def test_a_backend_requires_core_and_no_checkpoint_code(package: str) -> None:
    """A user installs only the backend for their hardware: its required dependencies name
    no package of this tree but core (and the shared Triton kernels)."""
    tree = {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file()}
    tree.add("nvfp4-conformance")
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    named = {
        re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0] for d in project["project"]["dependencies"]
    }
    assert named & tree == BACKENDS[package]
