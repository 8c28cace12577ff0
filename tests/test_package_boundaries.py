"""The boundaries between the repository's packages, read from their sources with ``ast``
(imports inside functions count):

* the conformance suite only certifies: no module of it imports torch or transformers (T6
  loads and decodes its model through nvfp4-torch);
* nvfp4-engines takes from the suite only its public names (the package's ``__all__``: the
  T6 golden reader, the suite's spec versions), never a module of its internals;
* no package but nvfp4-torch defines torch modules or registers torch operators.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
