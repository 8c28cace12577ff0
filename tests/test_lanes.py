"""``.ci/lanes.py``: ``nox -s tests`` runs the package sessions a few at a time, longest
first, each line of theirs printed as it comes with its package's label."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
import lanes  # noqa: E402

sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402


def _sleeper(seconds: float, text: str, code: int = 0) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import time,sys; print({text!r}, flush=True); time.sleep({seconds}); "
        f"print('done', file=sys.stderr); sys.exit({code})",
    ]


def test_lanes_run_side_by_side_and_label_every_line() -> None:
    out = io.StringIO()
    start = time.monotonic()
    status = lanes.run_lanes(
        [("a", _sleeper(1.5, "first")), ("b", _sleeper(1.5, "second", 3))], 2, out=out
    )
    took = time.monotonic() - start
    assert status == {"a": 0, "b": 3}  # a failure is reported, not raised
    assert took < 2.8, f"two 1.5 s commands in two lanes took {took:.1f} s"
    lines = out.getvalue().splitlines()
    assert sorted(lines) == ["[a] done", "[a] first", "[b] done", "[b] second"]


def test_one_lane_runs_in_the_order_given() -> None:
    out = io.StringIO()
    status = lanes.run_lanes(
        [("x", _sleeper(0.1, "1")), ("y", _sleeper(0, "2")), ("z", _sleeper(0, "3"))], 1, out=out
    )
    assert list(status) == ["x", "y", "z"]
    assert [line for line in out.getvalue().splitlines() if not line.endswith("done")] == [
        "[x] 1",
        "[y] 2",
        "[z] 3",
    ]


def test_the_next_command_starts_when_a_lane_frees() -> None:
    # the long one holds a lane; the two short ones follow each other in the other lane and
    # both end before it (a scheduler that waited for a whole round would run s2 after it)
    out = io.StringIO()
    lanes.run_lanes(
        [("long", _sleeper(3.0, "L")), ("s1", _sleeper(0.3, "1")), ("s2", _sleeper(0.3, "2"))],
        2,
        out=out,
    )
    ends = [line for line in out.getvalue().splitlines() if line.endswith("done")]
    assert ends == ["[s1] done", "[s2] done", "[long] done"]


def test_lane_count_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lanes.lane_count({}, cores=2) == 2
    assert lanes.lane_count({}, cores=16) == 2
    assert lanes.lane_count({}, cores=1) == 1
    assert lanes.lane_count({lanes.LANES_ENV: "3"}, cores=2) == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match=lanes.LANES_ENV):
            lanes.lane_count({lanes.LANES_ENV: bad}, cores=2)
    with pytest.raises(ValueError, match="labels"):
        lanes.run_lanes([("a", ["true"]), ("a", ["true"])], 2)


def test_longest_first_with_unknown_names_leading() -> None:
    expected = {"a": 10, "b": 300, "c": 40}
    assert lanes.longest_first(["a", "b", "c", "new"], expected) == ["new", "b", "c", "a"]


def test_the_gate_knows_every_package_and_starts_nvfp4_torch_first() -> None:
    assert set(noxfile.EXPECTED_TEST_SECONDS) == set(noxfile.PACKAGES)
    order = lanes.longest_first(list(noxfile.PACKAGES), noxfile.EXPECTED_TEST_SECONDS)
    assert order[0] == "nvfp4-torch"
    assert noxfile.package_session("nvfp4-cpu") == "package-tests(package='nvfp4-cpu')"


def test_in_lanes_only_the_longest_session_keeps_its_pytest_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(noxfile.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(noxfile.TEST_WORKERS, raising=False)
    monkeypatch.delenv(noxfile.IN_LANE_ENV, raising=False)
    assert noxfile._workers("nvfp4-core") == ["-n", "2", "--dist", "loadfile"]
    assert noxfile._workers("nvfp4-cpu") == []  # never: its kernels use every core
    monkeypatch.setenv(noxfile.IN_LANE_ENV, "1")
    assert noxfile._workers("nvfp4-core") == []
    assert noxfile._workers("nvfp4-torch") == ["-n", "2", "--dist", "loadfile"]
    longest = max(noxfile.EXPECTED_TEST_SECONDS, key=noxfile.EXPECTED_TEST_SECONDS.__getitem__)
    assert (longest,) == noxfile.PARALLEL_IN_LANES
