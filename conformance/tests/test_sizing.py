"""GPU-sized matmul cases and their interpreter stand-ins (:mod:`nvfp4_conformance.sizing`):
the stand-in keeps every tile edge and masked tail the full case has, every backend runs
it, and under ``TRITON_INTERPRET=1`` the full case is left out with the certificate
naming it and its stand-in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nvfp4_conformance import sizing

#: Shapes of the shipped tiers' GPU-sized cases, and others the rule must size.
SHAPES = [(300, 4096, 56), (1, 4096, 256), (300, 1024, 56), (257, 1040, 7), (4096, 8192, 1)]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_a_stand_in_keeps_every_tile_edge_and_tail(m: int, k: int, n: int) -> None:
    m2, k2, n2 = sizing.stand_in(m, k, n)
    assert (m2, k2) != (m, k)
    assert m2 <= m
    assert k2 <= k
    assert n2 == n
    for tile in (16, 32, 64, sizing.ROW_TILE):  # the row tiles of every config
        assert m2 % tile == m % tile, (tile, m, m2)
        assert -(-m2 // tile) >= min(2, -(-m // tile)), (tile, m, m2)  # two tiles or all
    for step in (32, 128, 256, 512, sizing.K_STEP):  # K steps and tiles of every config
        assert k2 % step == k % step, (step, k, k2)
    assert k2 >= min(k, sizing.K_STEP)  # two steps of 512 at least


def test_matmul_params_mark_the_gpu_sized_case_and_follow_it_with_its_stand_in() -> None:
    params = sizing.matmul_params([(2, 64, 7), (300, 4096, 56)], gpu_sized={"M300_K4096_N56"})
    assert [p.id for p in params] == ["M2_K64_N7", "M300_K4096_N56", "M172_K1024_N56"]
    assert [p.values for p in params] == [(2, 64, 7), (300, 4096, 56), (172, 1024, 56)]
    (mark,) = params[1].marks
    assert mark.name == sizing.MARKER
    assert mark.args == ("M300_K4096_N56", "M172_K1024_N56")
    assert not params[0].marks
    assert not params[2].marks
    labelled = sizing.matmul_params(
        [("M300_K1024_N56_dynamic", 300, 1024, 56, None)],
        gpu_sized={"M300_K1024_N56_dynamic"},
        labelled=True,
    )
    assert labelled[1].values == ("M172_K1024_N56_dynamic", 172, 1024, 56, None)


def test_matmul_params_refuse_what_they_cannot_size() -> None:
    with pytest.raises(ValueError, match="names no case"):
        sizing.matmul_params([(2, 64, 7)], gpu_sized={"M3_K64_N7"})
    with pytest.raises(ValueError, match="its own stand-in"):
        sizing.matmul_params([(2, 64, 7)], gpu_sized={"M2_K64_N7"})
    with pytest.raises(ValueError, match="should start with its shape"):
        sizing.matmul_params([("big", 2, 64, 7)], gpu_sized=(), labelled=True)


SELECT = (
    "--nvfp4-tiers=T4",
    "-k",
    "test_qmm_w4a8 and not fp8 and (M300_K4096_N56 or M172_K1024_N56)",
)


def test_under_the_interpreter_the_gpu_sized_case_is_left_out_and_named(
    run_tiers: Callable[..., tuple[pytest.RunResult, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``TRITON_INTERPRET=1``: the stand-in runs, the full size does not, the certificate
    says which and why and is partial; without it both run."""
    _, cert = run_tiers("reference", *SELECT)
    ran = {t["nodeid"].split("[")[1] for t in cert["tests"] if t["outcome"] == "passed"}
    assert {r.split("-")[0] for r in ran} == {"M300_K4096_N56", "M172_K1024_N56"}, ran
    assert not any("sized for a GPU" in e["reason"] for e in cert["left_out"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _result, cert = run_tiers("reference", *SELECT)
    ran = {t["nodeid"].split("[")[1].split("-")[0] for t in cert["tests"]}
    assert ran == {"M172_K1024_N56"}, ran
    assert all(t["outcome"] == "passed" for t in cert["tests"])
    # (-k's GPU-sized cases of the other tests are sized for a GPU too: it says so)
    (entry,) = [e for e in cert["left_out"] if "test_qmm_w4a8[M300_K4096_N56]" in e["reason"]]
    assert entry["tier"] == "T4"
    assert entry["tests"] == 3
    assert "sized for a GPU" in entry["reason"]
    assert "stand-in M172_K1024_N56" in entry["reason"]
    assert cert["result"] == "partial"
