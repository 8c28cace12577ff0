"""Spec 1.2's sharding numbers: ``[row_parallel]`` of ``spec/1.2/tolerances.toml``, read like
every released table (each value checked where it is read, :func:`nvfp4.tolerances.
parse_tables`), stated in the spec's prose, set 2-4x above the committed measurement. 1.0
and 1.1 have none: a certificate of theirs cannot reach them. The draft's readers of 1.2's
days answer one release more, with a warning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nvfp4 import tolerances
from nvfp4.tolerances import parse_tables, tolerances_for

CORE = Path(__file__).resolve().parents[1]
REPO = CORE.parents[1]
DTYPES = ("float32", "float16", "bfloat16")


def test_row_parallel_table_is_read_from_spec_1_2() -> None:
    table = tolerances_for("1.2")["row_parallel"]
    assert dict(table) == {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2}
    assert Path(str(tolerances.data_file("1.2"))) == REPO / "spec" / "1.2" / "tolerances.toml"
    # the older versions have no sharding numbers: a 1.1 certificate cannot reach them
    for version in ("1.0", "1.1"):
        assert "row_parallel" not in tolerances_for(version)
    # every number 1.1 has, 1.2 has unchanged (a minor version moves none)
    v11, v12 = tolerances_for("1.1"), tolerances_for("1.2")
    assert {p: dict(t) for p, t in v12.items() if p != "row_parallel"} == {
        p: dict(t) for p, t in v11.items()
    }


def test_the_drafts_readers_answer_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="draft_tolerances is renamed"):
        old = tolerances.draft_tolerances
    assert old()["row_parallel"] == tolerances_for("1.2")["row_parallel"]
    with pytest.warns(DeprecationWarning, match="parse_draft is renamed"):
        assert tolerances.parse_draft is parse_tables


def test_row_parallel_numbers_come_from_the_committed_measurement() -> None:
    measured = json.loads(
        (CORE / "scripts" / "results" / "shard_tolerances.json").read_text(encoding="utf-8")
    )
    assert measured["cases"] >= 2000
    table = tolerances_for("1.2")["row_parallel"]
    for dtype in DTYPES:
        worst = measured["row_parallel"][dtype]["max"]
        assert 2 * worst <= table[dtype] <= 4 * worst, (dtype, worst, table[dtype])
        # the forbidden order (partials reduced in the output dtype) would not fit
        if dtype != "float32":
            assert measured["informational_reduced_in_output_dtype"][dtype]["max"] > table[dtype]


def test_the_spec_prose_names_the_table_and_the_script() -> None:
    text = (REPO / "spec" / "1.2" / "nvfp4.md").read_text(encoding="utf-8")
    section = text[text.index("## Sharding for tensor and expert parallelism") :]
    section = section[: section.index("\n## ", 3)]
    assert "`[row_parallel]`" in section
    assert "measure_shard_tolerances.py" in section
    assert (CORE / "scripts" / "measure_shard_tolerances.py").is_file()
    assert re.search(r"^\| T7 sharded \|.*`\[row_parallel\]`", text, re.M)
    # 1.1's refusal of a split inside a block is replaced by the plan (1.1 keeps it)
    old_rule = "A split inside a block MUST be refused"
    assert old_rule not in " ".join(section.split())
    assert old_rule in " ".join((REPO / "spec" / "1.1" / "nvfp4.md").read_text().split())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "[row_parallel]\nfloat32 = -1.0\n",
            r"\[row_parallel\] float32: expected a finite number >= 0, found -1.0",
        ),
        ("[row_parallel]\nfloat32 = nan\n", r"found nan"),
        ("[row_parallel]\nfloat32 = 'x'\n", r"found 'x'"),
        ("[row_parallel]\nfloat32 = true\n", r"found True"),
        ("row_parallel = 3\n", r"\[row_parallel\]: expected a table, found 3"),
        ("[row_parallel\n", r"not TOML"),
    ],
)
def test_bad_values_are_refused_in_one_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_tables(text, "tolerances.toml")
    assert str(info.value).startswith("tolerances.toml: ")
    assert "\n" not in str(info.value)
