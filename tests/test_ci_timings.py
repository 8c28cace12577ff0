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


LANES_LOG = """\
10:00:00 nox > Running session tests
10:00:01 [nvfp4-torch] nox > Running session package-tests(package='nvfp4-torch')
10:00:02 [nvfp4-core] nox > Running session package-tests(package='nvfp4-core')
10:01:00 [nvfp4-core] 800 passed in 50.00s
10:01:02 [nvfp4-core] nox > Session package-tests(package='nvfp4-core') was successful in a minute.
10:01:03 [nvfp4-cpu] nox > Running session package-tests(package='nvfp4-cpu')
10:02:00 [nvfp4-cpu] 1 failed, 770 passed in 40.00s
10:02:00 [nvfp4-cpu] nox > Session package-tests(package='nvfp4-cpu') failed.
10:04:00 [nvfp4-torch] 116 passed, 2 warnings in 230.00s (0:03:50)
10:04:01 [nvfp4-torch] nox > Session package-tests(package='nvfp4-torch') was successful in 4 minutes.
10:04:02 nox > Session tests failed.
10:04:02 nox > Running session lint
10:04:12 nox > Session lint was successful in 10 seconds.
"""


def test_sessions_in_lanes_keep_their_own_counts_and_count_once() -> None:
    sessions = ci_timings.parse(LANES_LOG.splitlines())
    got = {s.name: (s.seconds, s.outcome, s.lane, s.counts) for s in sessions}
    assert got["tests"] == (242, "failed", "", {})
    assert got["lint"] == (10, "successful", "", {})
    torch = "package-tests(package='nvfp4-torch')"
    assert got[torch] == (240, "successful", "nvfp4-torch", {"passed": 116})
    core = "package-tests(package='nvfp4-core')"
    assert got[core] == (60, "successful", "nvfp4-core", {"passed": 800})
    cpu = "package-tests(package='nvfp4-cpu')"
    assert got[cpu] == (57, "failed", "nvfp4-cpu", {"failed": 1, "passed": 770})
    data = ci_timings.figures(sessions)
    assert data["test_command_seconds"] == 252  # tests' wall time and lint, not the lanes'
    assert f"| `{torch}` (in a lane) | 4:00 | 116 passed | successful |" in ci_timings.markdown(
        data
    )
