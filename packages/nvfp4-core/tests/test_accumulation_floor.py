"""Spec 1.3's accumulation floor: read from ``spec/1.3/tolerances.toml`` and checked where it
is read, computed by :mod:`nvfp4.accumulation_floor`, judged by
:func:`nvfp4.testing.assert_within`; and it covers the input on which spec 1.0-1.2
contradict themselves (every float32 order misses their bound there)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import reference, tolerances
from nvfp4.accumulation_floor import absolute_sums, allowance, output_spacing, unit
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import assert_within, cancelling_blocks, error_figures, random_planes
from nvfp4.tolerances import AccumulationFloor, accumulation_floor, tolerance, tolerances_for

CORE = Path(__file__).resolve().parents[1]
SPEC_1_3 = CORE.parents[1] / "spec" / "1.3"

sys.path.insert(0, str(CORE / "scripts"))
import measure_cancellation as mc  # noqa: E402 - the maintainer script the factor comes from

FLOOR = accumulation_floor("1.3")


def test_1_3_has_the_floor_and_no_older_version_has_one() -> None:
    assert AccumulationFloor(2.5, ("qmm", "gather_qmm", "w4a4", "w4a8", "w4a8_fp8")) == FLOOR
    # every matmul path of 1.2 (those with per-dtype numbers on max|y - ref| / max|ref|)
    assert set(FLOOR.paths) <= set(tolerances_for("1.3"))
    for version in ("1.0", "1.1", "1.2"):
        assert accumulation_floor(version) is None, version


def _orders_on(x: np.ndarray, w: NVFP4Planes) -> dict[str, np.ndarray]:
    wv, g = reference.dequantize_unscaled(w), w.row_global()
    return {
        name: (order(x, w, wv) * g).astype(np.float32).astype(np.float64)
        for name, order in mc.ORDERS.items()
    }


def test_the_floor_covers_the_input_on_which_1_2_contradicts_itself() -> None:
    """Every float32 order 1.2's tolerances were measured with, and the sequential loop, is
    off by more than 1.2's ``[qmm] float32`` on the cancelling blocks; 1.3's floor holds
    each of them, and the float64 reference rounded once passes both."""
    assert FLOOR is not None
    x, w = cancelling_blocks()
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    floor = allowance(FLOOR, absolute_sums(x, w), full, "float32", x.shape[1])
    tol = tolerance("qmm", "float32", spec="1.2")
    assert tol == tolerance("qmm", "float32", spec="1.3")
    orders = _orders_on(x, w)
    assert set(orders) >= {"f32", "split16", "split256", "blockscale16", "sequential"}
    for name, y in orders.items():
        with pytest.raises(AssertionError, match=r"^qmm: max\|err\|/max\|ref\| = "):
            assert_within(y, full, tol, "qmm")  # 1.2's rule
        figs = assert_within(y, full, tol, "qmm", allowance=floor)  # 1.3's
        assert figs["max_rel_err"] > tol, name
        assert figs["max_rel_err_beyond_floor"] == 0.0, name
        assert figs["floor_decides"] == 1, name
    y32 = np.asarray(reference.qmm(x, w), np.float64)  # float64 sum, rounded once
    assert error_figures(y32, full)["max_rel_err"] <= tol


def test_1_4_gives_a_row_parallel_sum_the_floor_of_the_unsharded_call() -> None:
    """The cancelling blocks one on each of two ranks (spec 1.2's row-parallel arithmetic:
    each rank's float32 partial times its global, the partials summed in float32): every
    order is off by more than ``[row_parallel] float32``, which 1.2 and 1.3 hold the sum to
    alone; 1.4's floor of the unsharded call (K and S over every rank's terms) holds each
    of them."""
    floor_14 = accumulation_floor("1.4")
    assert floor_14 is not None
    assert "row_parallel" in floor_14.paths
    assert floor_14.factor == FLOOR.factor
    for version in ("1.2", "1.3"):
        old = accumulation_floor(version)
        assert old is None or "row_parallel" not in old.paths, version
    x, w = cancelling_blocks()
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    floor = allowance(floor_14, absolute_sums(x, w), full, "float32", x.shape[1])
    tol = tolerance("row_parallel", "float32", spec="1.4")
    assert tol == tolerance("row_parallel", "float32", spec="1.2")
    outputs = mc.order_outputs(x, w, world=2)
    assert set(outputs) == set(mc.ORDERS)
    for name, y in outputs.items():
        with pytest.raises(AssertionError, match=r"max\|err\|/max\|ref\| = "):
            assert_within(y, full, tol, "row_parallel")  # 1.2's and 1.3's rule
        figs = assert_within(y, full, tol, "row_parallel", allowance=floor)  # 1.4's
        assert figs["floor_decides"] == 1, name


def test_an_exact_zero_is_asked_only_where_s_is_zero() -> None:
    """1.0-1.2 ask y = 0 exactly when max|ref| = 0; where the sum cancels to exactly 0 a
    float32 order does not give it, and the floor holds them; only S = 0 (a zero row of x)
    leaves no room."""
    assert FLOOR is not None
    x, w = cancelling_blocks()
    x[0, 16:] = x[0, :16]  # the second block's activations equal the first's: ref = 0
    x = np.concatenate([x, np.zeros_like(x)])  # and a zero row: S = 0
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    assert not full.any()
    floor = allowance(FLOOR, absolute_sums(x, w), full, "float32", x.shape[1])
    assert floor[0, 0] > 0
    assert floor[1, 0] == 0
    nonzero = 0
    for name, y in _orders_on(x, w).items():
        nonzero += bool(y[0, 0] != 0)
        assert_within(y, full, 0.0, name, allowance=floor)
        assert y[1, 0] == 0, name
    assert nonzero >= 1  # 1.2's "exactly 0" fails some float32 order here
    bad = np.zeros_like(full)
    bad[1, 0] = 2.0**-149  # the smallest error where S = 0
    with pytest.raises(AssertionError, match="beyond their accumulation floor = inf"):
        assert_within(bad, full, 1e-4, "qmm", allowance=floor)


def test_an_error_beyond_the_floor_is_judged_as_before() -> None:
    """The floor admits what float32 accumulation reaches, nothing more: an error above
    both the tolerance and the floor fails with the figure it was judged by."""
    assert FLOOR is not None
    x, w = cancelling_blocks()
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    floor = allowance(FLOOR, absolute_sums(x, w), full, "float32", x.shape[1])
    y = full + 2 * floor
    with pytest.raises(AssertionError) as err:
        assert_within(y, full, 1e-4, "qmm case", allowance=floor)
    (line, *_) = str(err.value).splitlines()
    assert line.startswith(
        "qmm case: max|err|/max|ref| over the outputs beyond their accumulation floor = "
    )
    y = np.full_like(full, np.nan)
    figs = error_figures(y, full, floor, 1e-4)
    assert figs["max_rel_err_beyond_floor"] == float("inf")
    with pytest.raises(ValueError, match=r"a floor of \(2,\) for a reference of \(1, 1\)"):
        error_figures(full, full, np.zeros(2))


def test_the_sums_are_those_of_what_each_path_multiplies() -> None:
    """``S`` against a brute-force float64 sum over the decoded operands: x (W4A16), NVFP4
    activation planes (W4A4), int8 and FP8 activations (W4A8), and routed experts."""
    rng = np.random.default_rng(7)
    w = random_planes(rng, 5, 64, name="w")
    wd = reference.dequantize(w, "float32").astype(np.float64)  # rounded once: rel. 2^-24

    def brute(a: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return np.abs(a)[:, None, :] @ np.abs(weights)[None].transpose(0, 2, 1)

    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(absolute_sums(x, w), brute(x, wd)[:, 0], rtol=2**-22)
    xb = x.astype(ml_dtypes.bfloat16)
    want = brute(xb.astype(np.float64), wd)[:, 0]
    np.testing.assert_allclose(absolute_sums(xb, w), want, rtol=2**-22)
    xp = reference.quantize_activations(x)
    xd = reference.dequantize(xp, "float32").astype(np.float64)
    np.testing.assert_allclose(absolute_sums(xp, w), brute(xd, wd)[:, 0], rtol=2**-21)
    q8 = reference.quantize_activations_q8(x)
    assert isinstance(q8, Q8Activations)
    np.testing.assert_allclose(absolute_sums(q8, w), brute(q8.decoded(), wd)[:, 0], rtol=2**-22)
    fp8 = reference.quantize_activations_fp8(x)
    assert isinstance(fp8, FP8Activations)
    xf = fp8.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * float(fp8.input_scale)
    np.testing.assert_allclose(absolute_sums(fp8, w), brute(xf, wd)[:, 0], rtol=2**-22)
    experts = random_planes(rng, 5, 64, experts=3, name="experts")
    ed = reference.dequantize(experts, "float32").astype(np.float64)
    ids = np.array([2, 0, 7])  # 7: out of range, S = 0
    got = absolute_sums(x, experts, ids)
    for m, e in enumerate(ids[:2]):
        np.testing.assert_allclose(got[m], brute(x[m : m + 1], ed[e])[0, 0], rtol=2**-22)
    assert not got[2].any()
    stacked = absolute_sums(np.stack([x, 2 * x]), w)  # x [..., K]: S [..., N]
    assert stacked.shape == (2, 3, 5)
    np.testing.assert_array_equal(stacked[1], 2 * stacked[0])
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., K\], found shape \(\)"):
        absolute_sums(np.float32(1), w)


def test_the_spacing_is_the_output_dtypes() -> None:
    v = np.array([0.0, 1.0, 1.5, 3.0, 6.1e-5, 1e-7])
    assert not output_spacing(v, "float32").any()
    half = [2.0**-24, 2.0**-10, 2.0**-10, 2.0**-9, 2.0**-24, 2.0**-24]
    assert output_spacing(v, "float16").tolist() == half
    bf = output_spacing(v, ml_dtypes.bfloat16)
    assert bf.tolist() == [2.0**-133, 2.0**-7, 2.0**-7, 2.0**-6, 2.0**-22, 2.0**-31]
    for value, step in zip(v[1:4], half[1:4], strict=True):  # against numpy's own
        assert float(np.spacing(np.float16(value))) == step


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("factor = 0\npaths = ['qmm']", "factor: expected a finite number > 0, found 0"),
        ("factor = nan\npaths = ['qmm']", "factor: expected a finite number > 0, found nan"),
        ("factor = true\npaths = ['qmm']", "factor: expected a finite number > 0, found True"),
        ("factor = 2.5\npaths = []", "paths: expected a non-empty list of distinct paths"),
        ("factor = 2.5\npaths = ['qmm', 'qmm']", "found ['qmm', 'qmm']"),
        (
            "factor = 2.5\npaths = ['dequantize']",
            "among gather_qmm, qmm, row_parallel, w4a4, w4a8, w4a8_fp8, found",
        ),
        ("factor = 2.5\npaths = 'qmm'", "found 'qmm'"),
        ("factor = 2.5", "expected the keys factor and paths, found ['factor']"),
        ("factor = 2.5\npaths = ['qmm']\nextra = 1", "found ['extra', 'factor', 'paths']"),
    ],
)
def test_a_hostile_floor_table_is_refused_in_one_line(table: str, message: str) -> None:
    text = (SPEC_1_3 / "tolerances.toml").read_text(encoding="utf-8")
    start = text.index("\n[accumulation_floor]\n") + 1
    end = text.index("\n[", start + 1)
    hostile = text[:start] + "[accumulation_floor]\n" + table + "\n" + text[end:]
    data = tolerances._toml(hostile, "t.toml")
    with pytest.raises(ValueError) as err:
        tolerances.parse_floor(data, tolerances.parse_tables(hostile, "t.toml"), "t.toml")
    assert str(err.value).startswith("t.toml: [accumulation_floor]")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_floor_is_the_one_the_changelog_and_the_text_give() -> None:
    assert FLOOR is not None
    log = " ".join((SPEC_1_3 / "changelog.md").read_text(encoding="utf-8").split())
    assert f"`factor = {FLOOR.factor:g}`" in log
    assert re.search(
        r"^## 1\.3 - \d{4}-\d{2}-\d{2}$", (SPEC_1_3 / "changelog.md").read_text(), re.M
    )
    text = " ".join((SPEC_1_3 / "nvfp4.md").read_text(encoding="utf-8").split())
    assert "F * sqrt(K) * 2^-24 * S[m, n]" in text
    assert "`[accumulation_floor] factor`" in text
    assert unit(4) == 2 * 2.0**-24
