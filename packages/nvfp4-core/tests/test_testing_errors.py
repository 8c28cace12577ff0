"""The one error measure (nvfp4.testing.errors): its value and its rules for zero, empty
and non-finite arrays."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nvfp4.testing import assert_within, error_figures, relative_error


def test_the_measure_is_max_abs_error_over_max_abs_reference() -> None:
    ref = np.array([[1.0, -4.0], [2.0, 0.5]])
    y = np.array([[1.5, -4.0], [2.0, 0.25]])
    assert relative_error(y, ref) == 0.5 / 4.0
    figs = error_figures(y, ref)
    assert figs == {"max_abs_err": 0.5, "max_ref": 4.0, "max_rel_err": 0.125, "worst_at": (0, 0)}


def test_bfloat16_is_read_exactly() -> None:
    y = np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16)
    assert relative_error(y, np.array([1.0, 2.0 + 2.0**-7])) == 2.0**-7 / (2.0 + 2.0**-7)


def test_all_zero_reference() -> None:
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert relative_error(np.array([0.0, 1e-30, 0.0]), np.zeros(3)) == float("inf")


def test_empty_arrays_are_within_any_tolerance() -> None:
    figs = error_figures(np.zeros((0, 4)), np.zeros((0, 4)))
    assert figs == {"max_abs_err": 0.0, "max_ref": 0.0, "max_rel_err": 0.0, "worst_at": ()}
    assert_within(np.zeros(0), np.zeros(0), 0.0, "empty")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_output_is_infinitely_wrong(bad: float) -> None:
    y = np.array([1.0, bad, bad])
    figs = error_figures(y, np.ones(3))
    assert figs == {"max_abs_err": np.inf, "max_ref": 1.0, "max_rel_err": np.inf, "nonfinite": 2}
    with pytest.raises(AssertionError, match="2 non-finite outputs"):
        assert_within(y, np.ones(3), 1e9, "y")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_reference_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="1 non-finite"):
        relative_error(np.ones(2), np.array([1.0, bad]))


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match=r"shape \(2,\) against a reference of \(1, 2\)"):
        relative_error(np.ones(2), np.ones((1, 2)))


def test_assert_within_passes_at_the_tolerance_and_fails_above_it() -> None:
    ref, y = np.array([2.0, 4.0]), np.array([2.0, 4.5])
    assert assert_within(y, ref, 0.125, "at")["max_rel_err"] == 0.125
    with pytest.raises(AssertionError) as info:
        assert_within(y, ref, 0.1, "qmm case", diagnose=lambda: ["  a diagnosis"])
    assert str(info.value) == (
        "qmm case: max|err|/max|ref| = 0.125 > tolerance 0.1 "
        "(max|err| 0.5, max|ref| 4, worst at (1,))\n  a diagnosis"
    )
