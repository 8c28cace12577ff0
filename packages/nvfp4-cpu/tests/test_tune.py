"""The tuner (nvfp4_cpu.tune): the choice rule (>= 3% faster or the derived plan stays), the
candidates, the plans file (where it lives, read back by the backend, hostile files refused in
one line and never overwritten), and one real tuning run on a small shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvfp4_cpu import CPUBackend, plan, tune
from nvfp4_cpu import plans_file as plans_file_mod
from nvfp4_cpu._native import Native


@pytest.fixture(autouse=True)
def _isolated(native: Native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A private XDG cache directory, no cache override, and the plan in effect restored."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("NVFP4_CPU_CACHE", raising=False)
    before = plan.current(native)
    yield
    plan.put(native, before.caches, before.source, before.blocking)
    plan._TUNED = None  # the module's record of what it applied


DERIVED = (1024, 32, 8)


@pytest.mark.parametrize(
    ("others", "want"),
    [
        ({(2048, 32, 8): 0.98}, (DERIVED, 1.0)),  # 2% faster: not enough
        ({(2048, 32, 8): 0.97}, ((2048, 32, 8), 0.97)),  # exactly 3%
        ({(2048, 32, 8): 0.95, (0, 32, 4): 0.90}, ((0, 32, 4), 0.90)),  # the fastest wins
        ({(2048, 32, 8): 1.20}, (DERIVED, 1.0)),
    ],
)
def test_choose_keeps_the_derived_plan_unless_3_percent_faster(
    others: dict[tuple[int, int, int], float], want: tuple[tuple[int, int, int], float]
) -> None:
    best, ratio = tune.choose({DERIVED: 1.0, **others}, DERIVED)
    assert best == want[0]
    assert ratio == pytest.approx(want[1])


@pytest.mark.parametrize("derived", [(1024, 32, 8), (256, 16, 4), (16384, 32, 8), (4096, 32, 8)])
def test_candidates_are_valid_plans(native: Native, derived: tuple[int, int, int]) -> None:
    cands = tune.candidates(derived)
    assert cands[0] == derived
    assert len(cands) == len(set(cands)) <= 8
    assert (0, derived[1], derived[2]) in cands  # the schedule before the plan is timed too
    for c in cands:
        assert plan.put(native, (32 << 10, 512 << 10, 0), "given", c).blocking == c


def test_plans_file_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tune.plans_file() == tmp_path / "xdg" / "nvfp4" / "plans.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # not absolute: ignored, as XDG says
    assert tune.plans_file() == Path.home() / ".cache" / "nvfp4" / "plans.json"


def _store(native: Native, isa: str, entry: object) -> Path:
    caches, _ = plan.detect_caches(native)
    path = tune.plans_file()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "plans": {tune.machine_key(isa, caches): entry}}))
    return path


def test_stored_plan_is_used_and_stated(native: Native, monkeypatch: pytest.MonkeyPatch) -> None:
    isa = native.best_isa()
    _store(native, isa, {"kc": 768, "kp": 16, "group": 4, "time_ratio": 0.9})
    a = CPUBackend(isa=isa).availability()
    assert a.ok, a.reason
    assert "kc 768, kp 16, 4 tiles per item (tuned)" in a.device
    assert plan.current(native).blocking == (768, 16, 4)
    monkeypatch.setenv("NVFP4_CPU_CACHE", "l2=512K")  # an override wins over the tuned plan
    a = CPUBackend(isa=isa).availability()
    assert "kc 1024, kp 32, 8 tiles per item" in a.device
    assert "(tuned)" not in a.device


def test_an_entry_for_another_machine_is_not_used(native: Native) -> None:
    caches, _ = plan.detect_caches(native)
    path = tune.plans_file()
    path.parent.mkdir(parents=True)
    key = tune.machine_key(native.best_isa(), caches).replace(" | ", " | other ", 1)
    path.write_text(json.dumps({"version": 1, "plans": {key: {"kc": 768, "kp": 16, "group": 4}}}))
    a = CPUBackend(isa=native.best_isa()).availability()
    assert a.ok, a.reason
    assert "(tuned)" not in a.device
    assert plan.current(native).blocking == plan.derive(native, caches)


HOSTILE = {
    "not JSON": b"{version: 1",
    "not UTF-8": b'{"version": 1, "plans": {"\xff": 1}}',
    "a list": b"[]",
    "version 2": b'{"version": 2, "plans": {}}',
    "plans a list": b'{"version": 1, "plans": []}',
    "entry a string": b'{"version": 1, "plans": {"K": "fast"}}',
    "kc not a step": b'{"version": 1, "plans": {"K": {"kc": 100, "kp": 32, "group": 8}}}',
    "kc too big": b'{"version": 1, "plans": {"K": {"kc": 1e400, "kp": 32, "group": 8}}}',
    "kp a string": b'{"version": 1, "plans": {"K": {"kc": 1024, "kp": "32", "group": 8}}}',
    "group a bool": b'{"version": 1, "plans": {"K": {"kc": 1024, "kp": 32, "group": true}}}',
    "group missing": b'{"version": 1, "plans": {"K": {"kc": 1024, "kp": 32}}}',
    "too big": b'{"version": 1, "plans": {}, "pad": "' + b"x" * (1 << 20) + b'"}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_plans_file_refused_in_one_line(native: Native, case: str) -> None:
    path = tune.plans_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(HOSTILE[case])
    with pytest.raises(ValueError) as exc:
        tune.read_plans(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ")
    assert "\n" not in msg
    assert len(msg) < 300
    # the backend warns in one line and runs the derived plan
    plans_file_mod._WARNED.clear()  # warned once per process otherwise
    with pytest.warns(UserWarning, match="tuned plans ignored: ") as rec:
        a = CPUBackend(isa=native.best_isa()).availability()
    assert a.ok, a.reason
    assert "\n" not in str(rec[0].message)
    caches, _ = plan.detect_caches(native)
    assert plan.current(native).blocking == plan.derive(native, caches)
    # the tuner stops and leaves the file alone
    assert tune.main(["--shapes", "32x256", "--m", "2", "--rounds", "1"]) == 2
    assert path.read_bytes() == HOSTILE[case]


def test_a_real_tuning_run_writes_a_valid_file(
    native: Native, capsys: pytest.CaptureFixture[str]
) -> None:
    isa = native.best_isa()
    assert (
        tune.main(
            ["--isa", isa, "--threads", "1", "--shapes", "64x512", "--m", "32", "--rounds", "1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "plans timed in" in out
    path = tune.plans_file()
    caches, _ = plan.detect_caches(native)
    if "stored in" in out:
        entry = tune.read_plans(path)[tune.machine_key(isa, caches)]
        assert entry["time_ratio"] <= tune.MIN_GAIN
        assert tune.stored_blocking(native, isa, caches) == (
            entry["kc"],
            entry["kp"],
            entry["group"],
        )
    else:
        assert "the derived plan stays" in out
        assert tune.stored_blocking(native, isa, caches) is None
    assert [p.name for p in path.parent.glob(".plans-*")] == []  # no temporary left behind


def test_tuner_refuses_a_cache_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_CPU_CACHE", "l2=512K")
    with pytest.raises(SystemExit):
        tune.main(["--shapes", "32x256"])
