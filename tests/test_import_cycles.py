"""No import cycles between the modules of the repository's packages.

Every ``import`` and ``from ... import`` of every module is read with ``ast`` - at module
level and inside functions alike (a lazy import that closes a loop is still a loop) - except
those under ``if TYPE_CHECKING:``. ``from pkg import name`` is an edge to ``pkg.name`` when
that is a module, else to ``pkg`` itself (its ``__init__``). A package's ``__init__`` that
re-exports its submodules is the top of its own graph: a submodule that imports it back
closes a cycle and is reported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _roots() -> list[Path]:
    """The import roots: every ``src/`` folder of the repository's packages."""
    return sorted(
        p for p in [*ROOT.glob("packages/*/src"), ROOT / "conformance" / "src"] if p.is_dir()
    )


def _modules() -> dict[str, Path]:
    found = {}
    for root in _roots():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the repository modules it imports."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for t in targets:
                while t and t not in modules:  # import a.b.c of a package a.b
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges[name].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "nvfp4.backend" in edges
    assert "nvfp4.frontend" in edges["nvfp4.backend"]
    assert "nvfp4.contract" in edges["nvfp4_cpu.backend"]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
