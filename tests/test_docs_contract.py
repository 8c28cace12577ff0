"""``docs/architecture.md``'s kernel-contract table is the contract of ``nvfp4.contract``.

The table under "The verbs and the kernel contract" lists one row per member a backend may
implement. It must name every kernel of :data:`nvfp4.contract.KERNELS` with the capability
that certifies it (column "certified by"), the members of the :class:`nvfp4.contract.Kernels`
protocol and the optional ``to_planes``, nothing else, and each signature with the parameter
names of the protocol's docstring.
"""

from __future__ import annotations

import re
from pathlib import Path

from nvfp4 import contract

ROOT = Path(__file__).resolve().parents[1]
SECTION = "The verbs and the kernel contract"
_SIGNATURE = re.compile(r"(\w+)(?:\((.*)\))?")


def _params(text: str | None) -> list[str]:
    """``"x, w, *, out_dtype: str"`` -> ``["x", "w", "*", "out_dtype"]``."""
    if not text:
        return []
    return [p.split(":", 1)[0].strip() for p in text.split(",")]


def _table(markdown: str) -> list[list[str]]:
    """The rows (cells, header and separator left out) of the first table of SECTION."""
    body = markdown.split(f"## {SECTION}\n", 1)
    assert len(body) == 2, f"docs/architecture.md has no section {SECTION!r}"
    section = re.split(r"^## ", body[1], maxsplit=1, flags=re.MULTILINE)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith("|")]
    assert len(lines) > 2, f"no table under {SECTION!r}"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["member", "receives", "returns", "certified by"], header
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def table_members(markdown: str) -> dict[str, tuple[list[str], str]]:
    """Member name -> (its parameters as the table writes them, its "certified by")."""
    members: dict[str, tuple[list[str], str]] = {}
    for cells in _table(markdown):
        assert len(cells) == 4, f"row {cells}"
        certified = cells[3].strip("`")
        for signature in re.findall(r"`([^`]+)`", cells[0]):
            m = _SIGNATURE.fullmatch(signature)
            assert m, f"member cell {signature!r}"
            assert m.group(1) not in members, f"{m.group(1)} listed twice"
            members[m.group(1)] = (_params(m.group(2)), certified)
    return members


def contract_signatures() -> dict[str, list[str]]:
    """The optional members' signatures as the ``Kernels`` protocol's docstring states them."""
    doc = contract.Kernels.__doc__ or ""
    found = {
        m.group(1): _params(m.group(2))
        for m in re.finditer(r"^\s+(\w+)\((.*)\) ->", doc, flags=re.MULTILINE)
    }
    assert set(contract.KERNELS) <= set(found), "the protocol docstring lacks a kernel"
    return found


def test_the_table_lists_every_kernel_of_the_contract() -> None:
    members = table_members((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    certified = {name: cap for name, (_, cap) in members.items() if cap}
    assert certified == contract.KERNELS, (
        "docs/architecture.md's kernel rows (member -> certified by) differ from "
        f"nvfp4.contract.KERNELS:\n  docs:     {certified}\n  contract: {contract.KERNELS}"
    )
    required = {"info"} | {
        name
        for name, value in vars(contract.Kernels).items()
        if callable(value) and not name.startswith("_")
    }
    assert required == {"info", "availability", "prepare", "from_numpy", "to_numpy"}
    optional = contract_signatures()
    assert set(members) == required | set(optional), (
        f"members in the table {sorted(members)}, in the contract {sorted(required | set(optional))}"
    )
    for name, params in optional.items():
        assert members[name][0] == params, f"{name}: docs {members[name][0]}, contract {params}"


def test_the_parser_reads_what_it_should() -> None:
    doc = (
        f"## {SECTION}\n\n| member | receives | returns | certified by |\n|---|---|---|---|\n"
        "| `info` | | x | |\n| `from_numpy(a)`, `to_numpy(a)` | | y | |\n"
        "| `qmm(x, w, *, out_dtype)` | | z | `qmm` |\n\n## Next\n\n| a | b |\n|---|---|\n"
    )
    assert table_members(doc) == {
        "info": ([], ""),
        "from_numpy": (["a"], ""),
        "to_numpy": (["a"], ""),
        "qmm": (["x", "w", "*", "out_dtype"], "qmm"),
    }
