"""The draft spec's (1.2) tolerance file: ``nvfp4.tolerances.draft_tolerances`` reads
``spec/draft/tolerances.toml``; its ``[row_parallel]`` table is parsed like the released
tables, stated in the spec's prose, set 2-4x above the committed measurement, and shipped in
a wheel by the build hook. Released versions never see it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nvfp4 import tolerances
from nvfp4.tolerances import draft_tolerances, parse_draft, tolerances_for

CORE = Path(__file__).resolve().parents[1]
REPO = CORE.parents[1]
DTYPES = ("float32", "float16", "bfloat16")


def test_row_parallel_table_is_read_from_the_draft() -> None:
    table = draft_tolerances()["row_parallel"]
    assert dict(table) == {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2}
    assert Path(str(tolerances.draft_data_file())) == REPO / "spec" / "draft" / "tolerances.toml"
    # a released version has no sharding numbers: a 1.1 certificate cannot reach them
    for version in ("1.0", "1.1"):
        assert "row_parallel" not in tolerances_for(version)


def test_row_parallel_numbers_come_from_the_committed_measurement() -> None:
    measured = json.loads(
        (CORE / "scripts" / "results" / "shard_tolerances.json").read_text(encoding="utf-8")
    )
    assert measured["cases"] >= 2000
    table = draft_tolerances()["row_parallel"]
    for dtype in DTYPES:
        worst = measured["row_parallel"][dtype]["max"]
        assert 2 * worst <= table[dtype] <= 4 * worst, (dtype, worst, table[dtype])
        # the forbidden order (partials reduced in the output dtype) would not fit
        if dtype != "float32":
            assert measured["informational_reduced_in_output_dtype"][dtype]["max"] > table[dtype]


def test_the_spec_prose_names_the_table_and_the_script() -> None:
    text = (REPO / "spec" / "draft" / "nvfp4.md").read_text(encoding="utf-8")
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
def test_bad_draft_values_are_refused_in_one_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_draft(text, "draft.toml")
    assert str(info.value).startswith("draft.toml: ")
    assert "\n" not in str(info.value)
