"""``tools/ci_timings.py`` reads a stamped nox log into the figures ``docs/ci/`` publishes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import ci_timings  # noqa: E402

LOG = """\
23:58:00 nox > Running session tests(package='nvfp4-core')
23:58:05 nox > uv pip install ...
23:59:10 761 passed, 2 skipped in 60.12s (0:01:00)
23:59:30 nox > Session tests(package='nvfp4-core') was successful in a minute.
23:59:30 nox > Running session lint
00:00:10 nox > Session lint failed.
00:00:11 nox > Running session conformance
00:09:11 nox > Session conformance was successful in 9 minutes.
"""


def test_sessions_times_and_counts() -> None:
    sessions = ci_timings.parse(LOG.splitlines())
    assert [(s.name, s.seconds, s.outcome) for s in sessions] == [
        ("tests(package='nvfp4-core')", 90, "successful"),
        ("lint", 40, "failed"),
        ("conformance", 540, "successful"),
    ]
    assert sessions[0].counts == {"passed": 761, "skipped": 2}
    data = ci_timings.figures(sessions)
    assert data["test_command_seconds"] == 130
    assert data["main_job_seconds"] == 540
    table = ci_timings.markdown(data)
    assert "| `lint` | 0:40 | - | failed |" in table
    assert "**11:10**" in table
