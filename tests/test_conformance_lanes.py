"""``nox -s conformance``'s two lanes: the Triton backends under the interpreter and the
reference in a second nox process, the native CPU backends in the first; the second lane's
sessions follow the gate's T7 policy, and a session that is not interpreted never passes
TRITON_INTERPRET on to the suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

EVERY = ["reference", "cpu", "metal", "cuda", "rocm"]


@pytest.fixture
def two_cores_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noxfile.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(noxfile.targets, "driver_evidence", lambda vendor: None)


@pytest.mark.usefixtures("two_cores_no_gpu")
def test_the_second_lane_holds_the_interpreter_runs_then_the_reference() -> None:
    assert noxfile._second_lane(EVERY) == ["cuda", "rocm", "reference"]
    first = [hw for hw in EVERY if hw not in noxfile._second_lane(EVERY)]
    assert first == ["cpu", "metal"]  # the backend that fills the model cache starts first
    assert noxfile._second_lane(["reference", "cpu"]) == []  # no interpreter run: one lane
    assert noxfile._second_lane(["reference", "cpu", "cuda"]) == ["cuda", "reference"]
    assert noxfile._second_lane(["reference", "cuda"]) == []  # never everything


def test_no_second_lane_on_one_core_or_where_the_gpus_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(noxfile.targets, "driver_evidence", lambda vendor: None)
    monkeypatch.setattr(noxfile.os, "cpu_count", lambda: 1)
    assert noxfile._second_lane(EVERY) == []
    monkeypatch.setattr(noxfile.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(noxfile.targets, "driver_evidence", lambda vendor: f"/dev/{vendor}")
    assert noxfile._second_lane(EVERY) == []  # every backend compiled for its GPU: one lane


def test_the_gate_runs_greedy_parity_for_its_named_backends_and_the_full_run_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(noxfile.FULL_RUN, raising=False)
    assert [hw for hw in EVERY if noxfile._gate_greedy(hw)] == list(noxfile.GATE_T7_GREEDY)
    monkeypatch.setenv(noxfile.FULL_RUN, "1")
    assert all(noxfile._gate_greedy(hw) for hw in EVERY)


def test_a_run_that_is_not_interpreted_unsets_triton_interpret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second lane's process has TRITON_INTERPRET=1 for its interpreted sessions; the
    reference run there must not inherit it (the suite would call its device the Triton
    interpreter, and leave out the GPU-sized cases): nox removes a variable given as None."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert noxfile._suite_env("reference", interpret=False)["TRITON_INTERPRET"] is None
    assert noxfile._suite_env("rocm", interpret=True)["TRITON_INTERPRET"] == "1"
    assert noxfile._suite_env("cpu", interpret=False)["NVFP4_BACKEND"] == "cpu"
