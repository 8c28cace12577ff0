"""The spec draft (``spec/draft/``, the next version while it is edited) follows
``spec/draft/README.md``, and its one change so far, the matmul bound's floor where a sum
cancels, covers the input on which spec 1.0-1.2 contradict themselves.

nvfp4-core reads no draft file (a backend certifies released versions only), so this test
reads the checkout's ``spec/draft`` itself. Releasing the draft moves these checks to the
released version's tests (``test_spec_drift.py`` and the tolerance data)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from nvfp4 import reference, spec
from nvfp4.spec_files import tomllib
from nvfp4.testing import cancelling_blocks
from nvfp4.tolerances import tolerance, tolerances_for

CORE = Path(__file__).resolve().parents[1]
DRAFT = CORE.parents[1] / "spec" / "draft"

sys.path.insert(0, str(CORE / "scripts"))
import measure_cancellation as mc  # noqa: E402 - the maintainer script the draft's number comes from


def _toml(name: str) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((DRAFT / name).read_text(encoding="utf-8"))
    return data


def test_the_draft_is_the_next_version_and_says_it_is_a_draft() -> None:
    text = (DRAFT / "nvfp4.md").read_text(encoding="utf-8")
    m = re.search(r"^Version: (\d+)\.(\d+) \(draft\)$", text, re.M)
    assert m, "spec/draft/nvfp4.md: no 'Version: X.Y (draft)' line"
    version = f"{m.group(1)}.{m.group(2)}"
    newest = max(spec.SUPPORTED_SPEC_VERSIONS, key=spec.version_key)
    assert spec.version_key(version) > spec.version_key(newest)
    assert version not in spec.SUPPORTED_SPEC_VERSIONS  # not released, so not in code
    assert re.search(r"^Status: draft", text, re.M)
    for name in ("tolerances.toml", "deviations.toml"):
        assert _toml(name)["spec_version"] == version, name
    log = (DRAFT / "changelog.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", log, re.M)
    assert headings == ["Unreleased"], headings  # a released section stays in its own folder


def test_the_floor_covers_the_input_on_which_1_2_contradicts_itself() -> None:
    """Every float32 order 1.2's tolerances were measured with, and the sequential loop, is
    off by more than 1.2's ``[qmm] float32`` on the draft's example; the draft's floor
    (``[accumulation_floor]``) holds each of them, and the float64 reference passes both."""
    floor = _toml("tolerances.toml")["accumulation_floor"]
    # every matmul path of 1.2 (those with per-dtype numbers on max|y - ref| / max|ref|)
    assert floor["paths"] == ["qmm", "gather_qmm", "w4a4", "w4a8", "w4a8_fp8"]
    assert set(floor["paths"]) <= set(tolerances_for("1.2"))
    x, w = cancelling_blocks()
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    peak = float(np.abs(full).max())
    bound = floor["factor"] * mc.unit(x.shape[1]) * mc.absolute_sums(x, w)
    wv, g = reference.dequantize_unscaled(w), w.row_global()
    tol = tolerance("qmm", "float32", spec="1.2")
    assert set(mc.ORDERS) >= {"f32", "split16", "split256", "blockscale16", "sequential"}
    for name, order in mc.ORDERS.items():
        y = (order(x, w, wv) * g).astype(np.float32).astype(np.float64)
        assert float(np.abs(y - full).max()) / peak > tol, name
        assert (np.abs(y - full) <= bound).all(), name
    y32 = np.asarray(reference.qmm(x, w), np.float64)  # float64 sum, rounded once
    assert float(np.abs(y32 - full).max()) / peak <= tol


def test_an_exact_zero_is_asked_only_where_s_is_zero() -> None:
    """1.0-1.2 ask y = 0 exactly when max|ref| = 0; where the sum cancels to exactly 0 a
    float32 order does not give it (one BLAS call, the sequential loop), and the floor
    holds them; only S = 0 (a zero row of x) leaves no room."""
    x, w = cancelling_blocks()
    x[0, 16:] = x[0, :16]  # the second block's activations equal the first's: ref = 0
    x = np.concatenate([x, np.zeros_like(x)])  # and a zero row: S = 0
    full = np.asarray(reference.qmm(x, w, out_dtype=None), np.float64)
    assert not full.any()
    factor = _toml("tolerances.toml")["accumulation_floor"]["factor"]
    bound = factor * mc.unit(x.shape[1]) * mc.absolute_sums(x, w)
    assert bound[0, 0] > 0
    assert bound[1, 0] == 0
    wv, g = reference.dequantize_unscaled(w), w.row_global()
    nonzero = 0
    for name, order in mc.ORDERS.items():
        y = (order(x, w, wv) * g).astype(np.float32).astype(np.float64)
        nonzero += bool(y[0, 0] != 0)
        assert (np.abs(y - full) <= bound).all(), name
        assert y[1, 0] == 0, name
    assert nonzero >= 1  # 1.2's "exactly 0" fails some float32 order here


def test_the_floor_is_the_one_the_changelog_gives() -> None:
    factor = _toml("tolerances.toml")["accumulation_floor"]["factor"]
    log = " ".join((DRAFT / "changelog.md").read_text(encoding="utf-8").split())
    assert f"`factor = {factor:g}`" in log
    text = " ".join((DRAFT / "nvfp4.md").read_text(encoding="utf-8").split())
    assert "F * sqrt(K) * 2^-24 * S[m, n]" in text
    assert "`[accumulation_floor] factor`" in text
