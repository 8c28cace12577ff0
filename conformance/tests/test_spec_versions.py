"""A certificate names one spec version and measures against that version's numbers only.

A hypothetical later version ("9.9", whose ``qmm`` numbers differ) is registered in
``nvfp4.tolerances`` for the duration of a test: the default lookup then returns 9.9's
numbers, while every lookup for 1.0 - :func:`nvfp4.tolerances.tolerance` with ``spec="1.0"``,
the suite's :func:`nvfp4_conformance.spec_tolerances.tolerance_lookup` and a whole T4 run with
``--nvfp4-spec 1.0`` - still returns 1.0's: a 1.0 certificate made after 9.9 exists is the
one made today.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from nvfp4 import tolerances
from nvfp4_conformance.spec_tolerances import tolerance_lookup

#: ``run_tiers`` (conftest): ``(backend, *pytest_args) -> (result, certificate)``.
RunTiers = Callable[..., tuple[pytest.RunResult, dict[str, Any]]]

#: 9.9's qmm numbers: every dtype's 1.0 number halved (a minor version may tighten one).
LATER = "9.9"


@pytest.fixture
def later_version(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """Register spec "9.9" in nvfp4.tolerances (undone after the test); its qmm table."""
    v10 = tolerances.tolerances_for("1.0")
    qmm = {dtype: number / 2 for dtype, number in v10["qmm"].items()}
    tables = {path: MappingProxyType(dict(t)) for path, t in v10.items()}
    tables["qmm"] = MappingProxyType(qmm)
    monkeypatch.setitem(tolerances._BY_VERSION, LATER, MappingProxyType(tables))
    return qmm


def test_core_lookup_for_1_0_ignores_a_later_version(later_version: dict[str, float]) -> None:
    assert tolerances.tolerance("qmm", "float32") == later_version["float32"]  # the newest
    assert tolerances.tolerance("qmm", "float32", spec=LATER) == later_version["float32"]
    assert tolerances.tolerance("qmm", "float32", spec="1.0") == 1e-4
    assert tolerances.tolerance("qmm", "bfloat16", spec="1.0") == 1e-2
    assert tolerances.tolerances_for("1.0")["qmm"]["float16"] == 1e-3


def test_suite_lookup_for_1_0_ignores_a_later_version(later_version: dict[str, float]) -> None:
    v10 = tolerance_lookup("1.0")
    later = tolerance_lookup(LATER)
    for path, table in tolerances.tolerances_for("1.0").items():
        for key, number in table.items():
            assert v10(path, key) == number, f"[{path}] {key}"
    for dtype, number in later_version.items():
        assert later("qmm", dtype) == number != v10("qmm", dtype)


def test_unknown_version_fails_the_lookup() -> None:
    import nvfp4

    with pytest.raises(nvfp4.SpecVersionError, match=r"'0\.9'.*supported: 1\.0"):
        tolerance_lookup("0.9")


def test_a_1_0_run_records_1_0_numbers(
    run_tiers: RunTiers, later_version: dict[str, float]
) -> None:
    result, cert = run_tiers("reference", "--nvfp4-tiers=T4", "--nvfp4-spec=1.0", "-k", "test_qmm[")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert cert["spec_version"] == "1.0"
    cases = [c for t in cert["tests"] if "test_qmm[" in t["nodeid"] for c in t["cases"]]
    assert cases
    v10 = tolerances.tolerances_for("1.0")["qmm"]
    for case in cases:
        assert case["tolerance"] == v10[case["dtype"]], case
        assert case["tolerance"] != later_version[case["dtype"]]


def test_a_1_0_run_leaves_the_w4a8_golden_cases_out(run_tiers: RunTiers) -> None:
    """T5 certifying 1.0 runs exactly the cases whose ``min_spec`` is 1.0, as before spec
    1.1 added W4A8 ones; those are skipped as "applies from spec 1.1", never failed, and
    W4A8 stays "not certified" for that reason."""
    from nvfp4.fixtures import list_cases

    result, cert = run_tiers("reference", "--nvfp4-tiers=T5", "--nvfp4-spec=1.0")
    assert result.ret == 0, result.stdout.str()[-3000:]
    by_spec = {c["name"]: c["min_spec"] for c in list_cases()}
    assert set(by_spec.values()) == {"1.0", "1.1"}
    golden = [t for t in cert["tests"] if "test_golden[" in t["nodeid"]]
    for t in golden:
        case = t["nodeid"].split("test_golden[", 1)[1].rsplit("-", 1)[0]
        if by_spec[case] == "1.0":
            assert t["outcome"] == "passed", t["nodeid"]
        else:
            assert (t["outcome"], t["skip_kind"]) == ("skipped", "spec"), t["nodeid"]
            assert "applies from spec 1.1; certifying 1.0" in t["message"]
    assert sum(t["outcome"] == "skipped" for t in golden) == 10
    assert not cert["illegal_skips"]
    for cap in ("w4a8", "w4a8_fp8"):
        assert cert["capabilities"][cap]["state"] == "not certified"
        assert "later spec version" in cert["capabilities"][cap]["why"]


def test_a_1_3_run_holds_a_cancelling_output_to_the_floor_and_a_1_2_run_does_not() -> None:
    """On the input where every float32 order misses 1.0-1.2's bound (one output whose sum
    cancels), a float32 sequential sum fails the suite's check when certifying 1.2 and
    passes when certifying 1.3; a result off by more than the floor fails both."""
    import numpy as np
    from nvfp4 import reference
    from nvfp4.testing import cancelling_blocks
    from nvfp4_conformance.calls import floor_of
    from nvfp4_conformance.checks import record_within

    x, w = cancelling_blocks()
    ref = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    terms = (x * reference.dequantize(w, "float32")).astype(np.float32)
    y = np.zeros((1, 1), np.float32)
    for t in terms[0]:  # one float32 running sum, k = 0, 1, ...
        y = (y + t).astype(np.float32)
    recorded: dict[str, dict[str, Any]] = {}

    def record(case: str, **figures: Any) -> None:
        recorded[case] = figures

    v12, v13 = tolerance_lookup("1.2"), tolerance_lookup("1.3")
    assert floor_of(v12, "qmm", x, w, ref, "float32") is None
    floor = floor_of(v13, "qmm", x, w, ref, "float32")
    assert floor is not None
    tol = v13("qmm", "float32")
    with pytest.raises(AssertionError, match=r"max\|err\|/max\|ref\| = .* > tolerance 0\.0001"):
        record_within(record, "1.2", y, ref, tol, "qmm")
    record_within(record, "1.3", y, ref, tol, "qmm", allowance=floor)
    assert recorded["1.3"]["max_rel_err"] > tol
    assert recorded["1.3"]["max_rel_err_beyond_floor"] == 0
    assert recorded["1.3"]["floor_decides"] == 1
    assert "floor_decides" not in recorded["1.2"]
    with pytest.raises(AssertionError, match="beyond their accumulation floor"):
        record_within(record, "far", ref + 3 * floor, ref, tol, "qmm", allowance=floor)
