"""Spec 1.5's deviation of a row-parallel sum, ``partials_in_activation_dtype``: its registry
entry, its emulation (:func:`nvfp4.deviation_emulators.row_parallel_sum`) and its bound
(:func:`nvfp4.deviation_emulators.partials_relative_bound`). The emulation departs from the
spec's rule on partials that cancel (so the deviation is one), and stays within its own bound;
the bound holds for every order of the reduction, in x's dtype or in float32."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import deviation_emulators as emu
from nvfp4 import deviation_registry as reg
from nvfp4 import reference
from nvfp4.accumulation_floor import absolute_sums, allowance
from nvfp4.shard_plan import shard_plan
from nvfp4.shard_planes import shard_planes
from nvfp4.testing import cancelling_halves
from nvfp4.tolerances import accumulation_floor, tolerance

DEVIATION = "partials_in_activation_dtype"
LOW = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def test_the_entry_is_1_5_s_and_bounded() -> None:
    d = reg.deviation(DEVIATION, spec="1.5")
    assert (d.bound, d.bound_value, d.tiers, d.scope) == ("partials_relative", 1.0, ("T7",), "real")
    assert d.admissible
    assert d.emulated
    assert DEVIATION in emu.SUM_DEVIATIONS
    with pytest.raises(KeyError, match=r"registry 1\.2: no deviation"):
        reg.deviation(DEVIATION, spec="1.4")


def test_unit_roundoff_of_each_output_dtype() -> None:
    assert emu.unit_roundoff("float32") == 2.0**-24
    assert emu.unit_roundoff("float16") == 2.0**-11
    assert emu.unit_roundoff("bfloat16") == 2.0**-8


def _partials(x: np.ndarray, w: object, world: int) -> list[np.ndarray]:
    """Each rank's exact (float64) partial of a row-parallel split of K over ``world``."""
    plan = shard_plan(x.shape[1], world, dim="k", name="w")
    out = []
    for r, rank in enumerate(plan):
        xr = np.zeros((x.shape[0], rank.padded), x.dtype)
        xr[:, : rank.size] = x[:, rank.start : rank.stop]
        out.append(reference.qmm(xr, shard_planes(w, plan, r), out_dtype=None))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_the_emulation_breaks_the_rule_and_keeps_its_bound(world: int, dtype: str) -> None:
    """On partials that cancel (K = 576, float32 x whose halves cancel to 2^-4..2^-12 of S),
    rounding each partial to x's dtype puts the sum outside ``[row_parallel]`` and the
    floor, and within ``gamma_w * sum |p_r|``."""
    x, w = cancelling_halves(np.random.default_rng(world), 3, 8, 576, depth=(4.0, 12.0))
    ref = reference.qmm(x, w, out_dtype=None)
    parts = _partials(x, w, world)
    np.testing.assert_allclose(
        np.sum(parts, axis=0), ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max()
    )
    plain = emu.row_parallel_sum(parts, dtype).astype(np.float64)
    assert np.array_equal(plain, ref.astype(LOW[dtype]).astype(np.float64))
    y = emu.row_parallel_sum(parts, dtype, deviations=[DEVIATION]).astype(np.float64)
    err = np.abs(y - ref)
    spec_floor = accumulation_floor("1.5")
    assert spec_floor is not None
    floor = allowance(spec_floor, absolute_sums(x, w), ref, dtype, 576)
    beyond = err > floor
    rel = err[beyond].max() / np.abs(ref).max() if beyond.any() else 0.0
    assert rel > tolerance("row_parallel", dtype, spec="1.5"), "the deviation is a departure"
    bound = emu.partials_relative_bound(parts, dtype, 1.0)
    assert (err <= bound + floor).all()


def _reductions(parts: list[np.ndarray], low: type) -> list[np.ndarray]:
    """Every way an engine may sum partials rounded to ``low``: in ``low`` sequentially in
    each rank order, as a pairwise tree, and in float32 then one cast."""
    rounded = [p.astype(low) for p in parts]
    out = []
    for order in itertools.islice(itertools.permutations(range(len(parts))), 24):
        acc = rounded[order[0]]
        for i in order[1:]:
            acc = (acc.astype(np.float64) + rounded[i].astype(np.float64)).astype(low)
        out.append(acc)
    level = list(rounded)
    while len(level) > 1:
        level = [
            (level[i].astype(np.float64) + level[i + 1].astype(np.float64)).astype(low)
            if i + 1 < len(level)
            else level[i]
            for i in range(0, len(level), 2)
        ]
    out.append(level[0])
    f32 = np.zeros_like(parts[0], dtype=np.float32)
    for r in rounded:
        f32 = (f32 + r.astype(np.float32)).astype(np.float32)
    out.append(f32.astype(low))
    return [o.astype(np.float64) for o in out]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_bound_holds_for_every_reduction_order(dtype: str) -> None:
    """Random partials of both signs, 2 to 16 ranks: every legal reduction of the rounded
    partials (sequential in 24 rank orders, a tree, float32 then one cast) within
    ``gamma_w * sum |p_r|`` of the exact sum. Measured worst: printed."""
    rng = np.random.default_rng(7)
    worst = 0.0
    for world in (2, 3, 4, 5, 8, 16):
        for _ in range(20):
            scale = 10.0 ** rng.uniform(-3, 3, (1, 64))
            parts = [rng.standard_normal((4, 64)) * scale for _ in range(world)]
            exact = np.sum(parts, axis=0)
            bound = emu.partials_relative_bound(parts, dtype, 1.0)
            for y in _reductions(parts, LOW[dtype]):
                ratio = np.abs(y - exact) / bound
                worst = max(worst, float(ratio.max()))
    print(f"{dtype}: worst error / bound = {worst:.3f}")
    assert worst <= 1.0
    assert worst > 0.05, "the bound is no looser than it needs to be by orders of magnitude"


def test_the_emulation_refuses_what_it_does_not_emulate() -> None:
    with pytest.raises(ValueError, match="not emulated here"):
        emu.row_parallel_sum([np.ones((1, 1))], "float16", deviations=["ct_encode_global"])
    with pytest.raises(ValueError, match="at least one rank"):
        emu.row_parallel_sum([], "float16")
