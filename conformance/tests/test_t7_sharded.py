"""T7 (sharding, spec 1.2) is collected only for spec >= 1.2 or when ``--nvfp4-tiers``
names it, so a 1.1 certificate means what it meant before T7; asked for, it spawns gloo
ranks at 2, 3, 4 and 8 and certifies the reference backend, with a T7 certificate section."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nvfp4_conformance.t7 import CASES, DTYPES, WORLDS, t7_applies


@pytest.mark.parametrize(
    ("spec", "tiers", "applies"),
    [
        ("1.1", None, False),
        ("1.0", None, False),
        ("1.1", frozenset({"T4", "T6"}), False),
        ("1.1", frozenset({"T7"}), True),
        ("1.0", frozenset({"T0", "T7"}), True),
        ("1.2", None, True),
        ("2.0", None, True),
        (None, None, False),
    ],
)
def test_t7_applies_from_spec_1_2_or_when_named(
    spec: str | None, tiers: frozenset[str] | None, applies: bool
) -> None:
    assert t7_applies(spec, tiers) is applies


#: ``run_tiers`` (conftest): ``(backend, *pytest_args) -> (result, certificate)``.
RunTiers = Callable[..., tuple[pytest.RunResult, dict[str, Any]]]


def _collect(run_tiers: RunTiers, *args: str) -> str:
    result, _ = run_tiers("reference", "--collect-only", "-q", *args)
    assert result.ret == 0, result.stdout.str()[-3000:]
    return result.stdout.str()


def test_a_1_1_run_does_not_collect_t7(run_tiers: RunTiers) -> None:
    out = _collect(run_tiers, "--nvfp4-spec=1.1")
    assert "test_t7_sharded" not in out
    assert "test_t4_matmul" in out
    assert "deselected" not in out  # not "left out": T7 is simply not part of 1.1


def test_naming_t7_collects_every_world_and_case(run_tiers: RunTiers) -> None:
    out = _collect(run_tiers, "--nvfp4-tiers=T7")
    t7 = [line for line in out.splitlines() if "test_t7_sharded.py::" in line]
    assert len(t7) == len(WORLDS) * len(CASES) * len(DTYPES)
    for w in WORLDS:
        assert any(f"[tp{w}-down_1856-float32]" in line for line in t7)


def test_t7_certifies_the_reference_backend(run_tiers: RunTiers, pytester: pytest.Pytester) -> None:
    pytest.importorskip("nvfp4_torch.ranks")  # the parity extra (torch)
    # the greedy parity (SmolLM2 on ranks: minutes) is test_t7_parity.py's
    result, cert = run_tiers("reference", "--nvfp4-tiers=T7", "-k", "not greedy_parity")
    assert result.ret == 0, result.stdout.str()[-3000:]
    t7 = [t for t in cert["tests"] if t["tier"] == "T7"]
    assert len(t7) == len(WORLDS) * len(CASES) * len(DTYPES)
    assert all(t["outcome"] == "passed" for t in t7)
    assert cert["result"] == "partial"  # the other tiers were left out
    section = cert["t7"]
    assert section["world_sizes"] == [2, 3, 4, 8]
    for path in ("row_parallel", "column_parallel", "expert_parallel"):
        for dtype in DTYPES:
            worst = section["worst"][path][dtype]
            assert float(worst["max_rel_err"]) > 0, (path, dtype, worst)
            assert worst["judged_by"] == "max_rel_err_beyond_floor", (path, dtype, worst)
            assert 0 <= worst["judged"] <= worst["tolerance"], (path, dtype, worst)
    assert section["worst"]["row_parallel"]["bfloat16"]["tolerance"] == 1e-2
    md = (pytester.path / "cert-reference.md").read_text(encoding="utf-8")
    assert "## T7 sharded (spec 1.2)" in md
    assert "| row_parallel | float32 |" in md
    assert "(max_rel_err_beyond_floor)" in md
    # from 1.4 the cancelling case runs, and only the floor of the unsharded call holds it
    cancelling = [t for t in t7 if "test_row_parallel_qmm_cancelling[" in t["nodeid"]]
    assert len(cancelling) == len(WORLDS) * len(DTYPES)
    floored = [
        c for t in cancelling for c in t["cases"] if float(c["max_rel_err"]) > c["tolerance"]
    ]
    assert floored  # even the reference's float32 partials miss [row_parallel] alone
    assert all(c["max_rel_err_beyond_floor"] == 0 for c in floored)
    assert "greedy_parity" not in section
