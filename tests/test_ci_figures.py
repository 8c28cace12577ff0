"""README's CI figures are the ones measured: the minutes it quotes for the main job, the test
command and ``.ci/run`` are those of ``docs/ci/timings.json`` (written by
``tools/ci_timings.py table LOG --json`` from a stamped run of ``.ci/run``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FIGURES = {
    "main_job_seconds": r"the main job took ([\d.]+) minutes",
    "test_command_seconds": r"the test command ([\d.]+) minutes",
    "total_seconds": r"([\d.]+) minutes for `\.ci/run` as a whole",
}


def quoted(readme: str) -> dict[str, float]:
    found = {}
    for key, pattern in _FIGURES.items():
        m = re.search(pattern, readme.replace("\n", " "))
        assert m, f"README.md: no figure matching {pattern!r}"
        found[key] = float(m.group(1))
    return found


def test_readme_quotes_the_measured_minutes() -> None:
    measured = json.loads((ROOT / "docs" / "ci" / "timings.json").read_text(encoding="utf-8"))
    said = quoted((ROOT / "README.md").read_text(encoding="utf-8"))
    for key, minutes in said.items():
        actual = measured[key] / 60
        assert abs(actual - minutes) <= 0.5, (
            f"README.md says {minutes} minutes for {key}; docs/ci/timings.json says "
            f"{actual:.1f} (run tools/ci_timings.py on a fresh .ci/run log)"
        )


def test_the_check_can_fail() -> None:
    text = "the main job took 9 minutes and the test command 12 minutes: 21 minutes for `.ci/run` as a whole"
    assert quoted(text) == {"main_job_seconds": 9, "test_command_seconds": 12, "total_seconds": 21}
