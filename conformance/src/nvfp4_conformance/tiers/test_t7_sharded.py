"""T7 sharded (spec 1.2, "Sharding for tensor and expert parallelism"): the backend
under test on every rank of gloo process groups of 2, 3, 4 and 8 ranks
(:mod:`nvfp4_conformance.t7`), weights cut by the shard plan, against the float64 unsharded
reference.

* row-parallel ``qmm`` (K in whole blocks; 64-value units; a padded last rank; o_proj by
  SmolLM2's 9 / 3 heads): the float32-reduced sum within 1.2's ``[row_parallel]``, each
  output within the accumulation floor of the unsharded call too from spec 1.4; and from
  1.4, a row-parallel sum whose ranks' partials cancel (``o_576_cancelling``); a failing
  sum is attributed to a declared ``partials_relative`` deviation (spec 1.5's registry)
  when every element is within its bound;
* column-parallel ``qmm`` (N at any row; fused q/k/v by the head plan; fused gate/up by
  the down projection's K plan, 64- and 128-value units): each rank's rows within ``[qmm]``
  of the certified version, a padded row exactly 0, and the gathered output equal to the
  ranks' outputs bit for bit;
* expert-parallel ``gather_qmm``: within ``[gather_qmm]``, out-of-range ids exactly zero.

Every rank must hold the same reduced result. T7 runs when the certified spec version is
1.2 or later, or when ``--nvfp4-tiers`` names it: it never changes a 1.1 certificate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from nvfp4 import reference

from nvfp4_conformance import attribution
from nvfp4_conformance.calls import floor_of
from nvfp4_conformance.checks import error_figures
from nvfp4_conformance.t7 import (
    CANCELLING_FROM_SPEC,
    CASES,
    DTYPES,
    WORLDS,
    Case,
    load_case,
    plans_of,
    rank_columns,
    x_in,
)

ROW = [c for c in CASES if c.kind == "row" and not c.cancels]
CANCELLING = [c for c in CASES if c.cancels]
COLUMN = [c for c in CASES if c.kind in ("column", "qkv", "gate_up")]
EXPERTS = [c for c in CASES if c.kind == "experts"]

_Test = TypeVar("_Test", bound=Callable[..., None])


@pytest.fixture(scope="session")
def t7_run(
    nvfp4_conformance_run: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[int, list[dict[str, np.ndarray]]]]:
    """Spawn the ranks once for the whole tier; ``(inputs folder, {world: rank outputs})``."""
    try:
        from nvfp4_torch.ranks import distributed_available
    except ImportError as exc:
        pytest.fail(
            f"T7 needs torch (torch.distributed) and nvfp4-torch: {exc}; install "
            "nvfp4-conformance[parity]",
            pytrace=False,
        )
    if not distributed_available():
        pytest.fail("T7: this torch build has no torch.distributed (gloo)", pytrace=False)
    from nvfp4_conformance.t7 import run_ranks

    folder = tmp_path_factory.mktemp("t7")
    run = nvfp4_conformance_run
    return folder, run_ranks(folder, run.backend_name, run.declared_capabilities)


def _every_world(capability: str, cases: list[Case]) -> Callable[[_Test], _Test]:
    """Mark a T7 test as certifying ``capability`` and run it for every world size, case of
    ``cases`` and dtype (test ids ``[tp<world>-<case>-<dtype>]``)."""
    marks = (
        pytest.mark.parametrize("world", WORLDS, ids=[f"tp{w}" for w in WORLDS]),
        pytest.mark.parametrize("case", cases, ids=[c.name for c in cases]),
        pytest.mark.parametrize("dtype", DTYPES),
        pytest.mark.requires_capability(capability),
    )

    def mark(test: _Test) -> _Test:
        for m in marks:
            test = m(test)
        return test

    return mark


@dataclass(frozen=True)
class Sharded:
    """One T7 test's case at one world size and output dtype: what the ranks were given
    (weights, activations in ``dtype``, expert ids) and what each rank returned."""

    case: Case
    world: int
    dtype: str
    w: Any
    x: np.ndarray
    ids: np.ndarray
    outs: list[dict[str, np.ndarray]]

    @property
    def key(self) -> str:
        """The name of this case's output in each rank's results."""
        return f"{self.case.name}|{self.dtype}"

    def require_every_rank_ran(self) -> None:
        """Fail with what the backend raised where it raised on a rank for this case (the
        other ranks' errors counted), before the outputs are read."""
        errors = [str(o[f"{self.key}|error"]) for o in self.outs if f"{self.key}|error" in o]
        if errors:
            more = f" (and on {len(errors) - 1} more ranks)" if len(errors) > 1 else ""
            pytest.fail(
                f"{self.case.name} at TP{self.world}, {self.dtype}: the backend raised on "
                f"{errors[0]}{more}",
                pytrace=False,
            )

    def record(
        self,
        nvfp4_record: Any,
        figs: dict[str, Any],
        tol: float,
        tolerance_of: str,
        *,
        rank: int | None = None,
        **fields: Any,
    ) -> None:
        """Record ``figs`` (:func:`error_figures` of an output, pass or fail) with the case's
        source, dtype, world size (and ``rank``, for one rank's output), ``fields`` and the
        tolerance."""
        c = self.case
        at, which = ("", {}) if rank is None else (f" rank {rank}", {"rank": rank})
        nvfp4_record(
            f"{c.name} TP{self.world}{at} {self.dtype}",
            source=c.source,
            dtype=self.dtype,
            world=self.world,
            **which,
            **fields,
            tolerance=tol,
            tolerance_of=tolerance_of,
            **figs,
        )

    def assert_within(
        self,
        figs: dict[str, Any],
        tol: float,
        table: str,
        measure: str = "max_rel_err",
        *,
        rank: int | None = None,
    ) -> None:
        """Fail unless the recorded ``max_rel_err`` is within ``tol`` (of ``[table]``): over
        the outputs beyond their accumulation floor where the figures have it."""
        c, at = self.case, "" if rank is None else f", rank {rank}"
        judged = "max_rel_err_beyond_floor" if "max_rel_err_beyond_floor" in figs else ""
        err = _judged(figs)
        beyond = " (outputs beyond their accumulation floor)" if judged else ""
        assert err <= tol, (
            f"{c.name} ({c.source}) at TP{self.world}{at}, {self.dtype}: {measure}{beyond} "
            f"{err:.3e} > {table} {tol:g}"
        )


def _judged(figs: dict[str, Any]) -> float:
    """The figure a case is judged by: ``max_rel_err`` over the outputs beyond their
    accumulation floor where the figures have one, else over every output."""
    return float(figs.get("max_rel_err_beyond_floor", figs["max_rel_err"]))


@pytest.fixture
def sharded(t7_run: Any, world: int, case: Case, dtype: str) -> Sharded:
    """The test's case (its ``world``, ``case`` and ``dtype`` parameters) from the ranks'
    run."""
    folder, results = t7_run
    w, x32, ids = load_case(folder, case)
    return Sharded(case, world, dtype, w, x_in(x32, dtype), ids, results[world])


def _same_on_every_rank(outs: list[dict[str, np.ndarray]], key: str) -> np.ndarray:
    first = outs[0][key]
    for r, o in enumerate(outs[1:], start=1):
        assert np.array_equal(o[key], first, equal_nan=True), (
            f"{key}: rank {r} holds another result than rank 0 after the all-reduce"
        )
    return first


def _row_parallel_tolerance(spec_version: str, dtype: str) -> float:
    """``[row_parallel]`` of the certified version, or of 1.2 (where T7 comes from) when T7
    runs by name under an older one."""
    from nvfp4.spec import version_key
    from nvfp4.tolerances import tolerance

    from nvfp4_conformance.t7 import T7_FROM_SPEC

    spec = max(spec_version, T7_FROM_SPEC, key=version_key)
    return float(tolerance("row_parallel", dtype, spec=spec))


def _check_row_parallel(
    s: Sharded, nvfp4_record: Any, nvfp4_tolerance: Any, nvfp4_spec_version: str
) -> None:
    """The reduced sum, the same on every rank, within ``[row_parallel]`` of the unsharded
    reference: over the outputs beyond the accumulation floor of the unsharded call (K and
    S over every rank's terms) where the certified version gives the sum one (1.4 on)."""
    case = s.case
    s.require_every_rank_ran()
    y = _same_on_every_rank(s.outs, s.key)
    ref = reference.qmm(s.x, s.w, out_dtype=None)
    tol = _row_parallel_tolerance(nvfp4_spec_version, s.dtype)
    floor = floor_of(nvfp4_tolerance, "row_parallel", s.x, s.w, ref, s.dtype)
    plan = plans_of(case, s.world)
    ranks = [[r.start, r.stop, r.padded] for r in plan]
    figs = error_figures(y, ref, floor, tol)
    explained: dict[str, Any] = {}
    if not _judged(figs) <= tol:
        # how much of each declared partials_relative bound the sum uses (at most 1: within)
        used = attribution.row_parallel_bounds_used(
            y, ref, floor, _exact_partials(s, plan), s.dtype
        )
        explained = {"explained_by": attribution.within_bound(used), "bound_used": used}
    s.record(nvfp4_record, figs, tol, "[row_parallel]", ranks=ranks, **explained)
    assert y.shape == (case.m, case.n)
    s.assert_within(figs, tol, "[row_parallel]", "row-parallel sum max|y - ref| / max|ref| =")


def _exact_partials(s: Sharded, plan: Any) -> list[np.ndarray]:
    """Each rank's partial of the row-parallel sum in float64 (the reference on its shard
    and its columns of x, zero-padded): what a ``partials_relative`` bound is relative to."""
    from nvfp4.shard_planes import shard_planes

    return [
        reference.qmm(rank_columns(s.x, rank), shard_planes(s.w, plan, r), out_dtype=None)
        for r, rank in enumerate(plan)
    ]


@_every_world("qmm", ROW)
def test_row_parallel_qmm(
    sharded: Sharded, nvfp4_record: Any, nvfp4_tolerance: Any, nvfp4_spec_version: str
) -> None:
    _check_row_parallel(sharded, nvfp4_record, nvfp4_tolerance, nvfp4_spec_version)


@pytest.mark.min_spec(CANCELLING_FROM_SPEC)
@_every_world("qmm", CANCELLING)
def test_row_parallel_qmm_cancelling(
    sharded: Sharded, nvfp4_record: Any, nvfp4_tolerance: Any, nvfp4_spec_version: str
) -> None:
    """Outputs whose sum cancels across K's halves: at TP2 each rank's float32 partial is
    half of ``S`` and the all-reduce cancels them; a float32 implementation is off by a
    large part of ``max|ref|`` there and conforms by the floor of the unsharded call."""
    _check_row_parallel(sharded, nvfp4_record, nvfp4_tolerance, nvfp4_spec_version)


def _column_reference(
    case: Case, w: Any, world: int, rank: int, ref: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reference columns rank ``rank`` computes, and which of them are padding (exactly
    0): its range of every partition of a fused weight (``w.partitions``), each followed
    by its padded rows."""
    plan = plans_of(case, world)
    if case.kind == "column":
        r = plan[rank]
        return ref[:, r.start : r.stop], np.zeros(r.size, bool)
    cols, pad = [], []
    for offset, p in zip(w.partitions[:-1], plan, strict=True):
        r = p[rank]
        cols += [
            ref[:, offset + r.start : offset + r.stop],
            np.zeros((ref.shape[0], r.padded - r.size)),
        ]
        pad += [np.zeros(r.size, bool), np.ones(r.padded - r.size, bool)]
    return np.concatenate(cols, axis=1), np.concatenate(pad)


@_every_world("qmm", COLUMN)
def test_column_parallel_qmm(sharded: Sharded, nvfp4_record: Any, nvfp4_tolerance: Any) -> None:
    s, case = sharded, sharded.case
    s.require_every_rank_ran()
    ref = reference.qmm(s.x, s.w, out_dtype=None)
    tol = float(nvfp4_tolerance("qmm", s.dtype))
    floor = floor_of(nvfp4_tolerance, "qmm", s.x, s.w, ref, s.dtype)
    locals_ = []
    for rank, rank_outs in enumerate(s.outs):
        y = rank_outs[s.key]
        want, padded = _column_reference(case, s.w, s.world, rank, ref)
        # the same columns of the floor; padding's is 0 (a padded output is exactly 0)
        allowance = None if floor is None else _column_reference(case, s.w, s.world, rank, floor)[0]
        assert y.shape == want.shape, f"{s.key} rank {rank}: shape {y.shape}, expected {want.shape}"
        assert not np.any(y[:, padded]), f"{s.key} rank {rank}: a padded row's output is not 0"
        figs = error_figures(y, want, allowance, tol)
        s.record(nvfp4_record, figs, tol, "[qmm]", rank=rank, padded_rows=int(padded.sum()))
        s.assert_within(figs, tol, "[qmm]", rank=rank)
        locals_.append(y)
    if case.kind == "column":  # a gather has no arithmetic: the ranks' values, bit for bit
        gathered = _same_on_every_rank(s.outs, f"{s.key}|gathered")
        assert np.array_equal(gathered, np.concatenate(locals_, axis=1)), (
            f"{s.key}: the gathered output differs from the ranks' own outputs"
        )
        assert gathered.shape == (case.m, case.n)


@_every_world("gather_qmm", EXPERTS)
def test_expert_parallel_gather_qmm(
    sharded: Sharded, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    s, case = sharded, sharded.case
    s.require_every_rank_ran()
    y = _same_on_every_rank(s.outs, s.key)
    ref = reference.gather_qmm(s.x, s.w, s.ids, out_dtype=None)
    tol = float(nvfp4_tolerance("gather_qmm", s.dtype))
    outside = (s.ids < 0) | (s.ids >= case.experts)
    floor = floor_of(nvfp4_tolerance, "gather_qmm", s.x, s.w, ref, s.dtype, s.ids)
    figs = error_figures(y, ref, floor, tol)
    s.record(nvfp4_record, figs, tol, "[gather_qmm]", out_of_range_rows=int(outside.sum()))
    assert outside.any()
    assert not np.any(y[outside]), f"{case.name} TP{s.world}: rows of out-of-range ids not zero"
    s.assert_within(figs, tol, "[gather_qmm]", "expert-parallel max_rel_err")
