"""Fused partitions and expert stacks: exact decode through fuse/unfuse and
stack/unstack, refusals, and reconcile_globals' report checked against a dense float64
computation (ml_dtypes as the E2M1 / E4M3 oracle)."""

from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import NVFP4Planes, PlaneError, dequantize
from nvfp4.fusion import (
    ReconcileReport,
    ReconcileWarning,
    fuse,
    globals_differ,
    partition_globals,
    reconcile_globals,
    stack_experts,
    unfuse,
    unstack_experts,
)
from nvfp4.reference import unpack_codes


def random_planes(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    name: str = "w",
    g: float | None = None,
) -> NVFP4Planes:
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(*lead, n, k // 16), dtype=np.uint8)
    if g is None:
        glob = np.exp2(rng.uniform(-12, 2, size=tuple(lead))).astype(np.float32)
    else:
        glob = np.full(tuple(lead), g, np.float32)
    return NVFP4Planes(codes, scales, glob, name=name)


def qkv(rng: np.random.Generator, experts: int | None = None) -> list[NVFP4Planes]:
    lead = () if experts is None else (experts,)
    return [
        random_planes(rng, (*lead, 8, 64), name="q"),
        random_planes(rng, (*lead, 3, 64), name="k"),
        random_planes(rng, (*lead, 5, 64), name="v"),
    ]


# -------------------------------------------------------------------------- fuse/unfuse
@pytest.mark.parametrize("experts", [None, 3])
def test_fuse_unfuse_decode_exactly(experts: int | None) -> None:
    parts = qkv(np.random.default_rng(1), experts)
    f = fuse(parts, "qkv")
    assert f.partitions == (0, 8, 11, 16)
    assert f.name == "qkv"
    expected_g = np.stack([p.global_scale for p in parts], axis=-1)
    assert f.global_scale.shape == ((3,) if experts is None else (experts, 3))
    assert np.array_equal(f.global_scale, expected_g)
    assert np.array_equal(dequantize(f), np.concatenate([dequantize(p) for p in parts], axis=-2))
    back = unfuse(f, names=["q", "k", "v"])
    for a, b in zip(back, parts, strict=True):
        assert a.name == b.name
        assert a.partitions is None
        assert np.array_equal(a.codes, b.codes)
        assert np.array_equal(a.scales, b.scales)
        assert np.array_equal(a.global_scale, b.global_scale)
        assert a.global_scale.shape == b.global_scale.shape
        assert np.shares_memory(a.codes, f.codes)  # views of the fused planes
    assert [p.name for p in unfuse(f)] == ["qkv.0", "qkv.1", "qkv.2"]


def test_fuse_of_fused_part_and_scalar_global() -> None:
    rng = np.random.default_rng(2)
    gate_up = fuse([random_planes(rng, (4, 32)), random_planes(rng, (6, 32))], "gu")
    shared = gate_up.replace(global_scale=np.float32(0.25))  # one global, two partitions
    other = random_planes(rng, (2, 32), g=0.5)
    f = fuse([shared, other], "x")
    assert f.partitions == (0, 4, 10, 12)
    assert np.array_equal(f.global_scale, np.array([0.25, 0.25, 0.5], np.float32))
    assert np.array_equal(dequantize(f), np.concatenate([dequantize(shared), dequantize(other)]))
    assert unfuse(other) == [other]


def test_fuse_refusals() -> None:
    rng = np.random.default_rng(3)
    with pytest.raises(PlaneError, match=r"'qkv'.*part 1 \('k'\) K: expected 64"):
        fuse([random_planes(rng, (2, 64), name="q"), random_planes(rng, (2, 32), name="k")], "qkv")
    with pytest.raises(PlaneError, match="experts"):
        fuse([random_planes(rng, (2, 2, 32)), random_planes(rng, (2, 32))], "x")
    with pytest.raises(PlaneError, match="at least one"):
        fuse([], "x")
    with pytest.raises(PlaneError, match="NVFP4Planes"):
        fuse([np.zeros(3)], "x")  # type: ignore[list-item]
    f = fuse(qkv(rng), "qkv")
    with pytest.raises(PlaneError, match="3 names"):
        unfuse(f, names=["a"])


# ------------------------------------------------------------------------------ experts
def test_stack_unstack_experts() -> None:
    rng = np.random.default_rng(4)
    parts = [random_planes(rng, (5, 48), name=f"e{i}") for i in range(4)]
    s = stack_experts(parts, "experts")
    assert s.shape == (4, 5, 48)
    assert s.global_scale.shape == (4,)
    assert np.array_equal(dequantize(s), np.stack([dequantize(p) for p in parts]))
    back = unstack_experts(s, names=[p.name for p in parts])
    for a, b in zip(back, parts, strict=True):
        assert a.global_scale.shape == ()
        assert a.global_scale == b.global_scale
        assert np.array_equal(a.codes, b.codes)
        assert a.name == b.name
    assert [p.name for p in unstack_experts(s)] == [f"experts.{i}" for i in range(4)]


def test_stack_fused_experts_and_refusals() -> None:
    rng = np.random.default_rng(5)
    experts = [fuse(qkv(rng), "qkv") for _ in range(2)]
    s = stack_experts(experts, "moe")
    assert s.partitions == (0, 8, 11, 16)
    assert s.global_scale.shape == (2, 3)
    assert np.array_equal(dequantize(s), np.stack([dequantize(e) for e in experts]))
    back = unstack_experts(s)
    assert back[1].global_scale.shape == (3,)
    assert back[1].partitions == (0, 8, 11, 16)
    assert np.array_equal(dequantize(back[1]), dequantize(experts[1]))
    with pytest.raises(PlaneError, match="shape"):
        stack_experts([random_planes(rng, (5, 48)), random_planes(rng, (4, 48))], "x")
    with pytest.raises(PlaneError, match="2-D"):
        stack_experts([random_planes(rng, (2, 5, 48))], "x")
    with pytest.raises(PlaneError, match="partitions"):
        stack_experts([experts[0], random_planes(rng, (16, 64))], "x")
    with pytest.raises(PlaneError, match=r"\[E, N, K\]"):
        unstack_experts(random_planes(rng, (5, 48)))


# ------------------------------------------------------------------------ reconciliation
def test_globals_differ() -> None:
    rng = np.random.default_rng(6)
    parts = [random_planes(rng, (2, 32), g=g) for g in (0.5, 2.0, 1.0)]
    assert globals_differ(fuse(parts, "x")) == 4.0
    assert globals_differ(parts[0]) == 1.0
    assert globals_differ(fuse(parts[:1] * 3, "same")) == 1.0
    moe = stack_experts([fuse(parts[:2], "a"), fuse(parts[1:], "b")], "m")
    assert globals_differ(moe) == 4.0  # the largest ratio over experts
    assert np.array_equal(partition_globals(moe), [[0.5, 2.0], [2.0, 1.0]])


def dense_reconcile(p: NVFP4Planes) -> tuple[np.ndarray, dict[str, float]]:
    """reconcile_globals computed directly in float64 with ml_dtypes: the expected scale
    bytes and the report figures, including the dense per-element relative error."""
    g = partition_globals(p).astype(np.float64)  # (P,) or (E, P)
    assert p.partitions is not None
    sizes = [b - a for a, b in itertools.pairwise(p.partitions)]
    g_row = np.repeat(g, sizes, axis=-1)[..., None]
    gmax_row = np.repeat(np.broadcast_to(g.max(axis=-1, keepdims=True), g.shape), sizes, axis=-1)[
        ..., None
    ]
    s = p.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    target = s * g_row / gmax_row
    underflow = (p.scales != 0) & (target < 2.0**-9)
    clamped = np.where(p.scales == 0, 0.0, np.maximum(target, 2.0**-9))
    new = clamped.astype(np.float32).astype(ml_dtypes.float8_e4m3fn)  # RNE
    new_bytes = new.view(np.uint8)
    s_new = new.astype(np.float64)

    e2m1 = unpack_codes(p.codes).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    e2m1 = e2m1.reshape(*p.scales.shape, 16)
    before = e2m1 * (s * g_row)[..., None]
    after = e2m1 * (s_new * gmax_row)[..., None]
    nz = before != 0
    dense_rel = float(np.max(np.abs(after - before)[nz] / np.abs(before[nz])))
    return new_bytes, {
        "blocks_changed": int(np.count_nonzero(new_bytes != p.scales)),
        "underflowed_blocks": int(np.count_nonzero(underflow)),
        "dense_rel": dense_rel,
    }


@pytest.mark.parametrize("experts", [None, 2])
def test_reconcile_globals_report_matches_dense_computation(experts: int | None) -> None:
    rng = np.random.default_rng(7)
    lead = () if experts is None else (experts,)
    parts = [
        random_planes(rng, (*lead, 24, 128), g=1.0),
        random_planes(rng, (*lead, 16, 128), g=0.3),
        random_planes(rng, (*lead, 8, 128), g=2.0**-11),  # small scales underflow
    ]
    f = fuse(parts, "qkv")
    # every block holds a nonzero element, so the dense error sees every block
    codes = unpack_codes(f.codes).reshape(*f.scales.shape, 16)
    codes[..., 0] = 7
    f = f.replace(codes=(codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(f.codes.shape))
    f = f.replace(scales=np.where(f.scales == 0, np.uint8(1), f.scales))
    with pytest.warns(ReconcileWarning, match=r"'qkv'.*blocks changed"):
        r, report = reconcile_globals(f)
    expected_bytes, figures = dense_reconcile(f)
    assert isinstance(report, ReconcileReport)
    assert np.array_equal(r.scales, expected_bytes)
    assert np.array_equal(r.codes, f.codes)
    assert r.partitions == f.partitions
    assert report.blocks_changed == figures["blocks_changed"] > 0
    assert report.underflowed_blocks == figures["underflowed_blocks"] > 0
    assert report.total_blocks == f.scales.size
    assert report.max_global_ratio == pytest.approx(2.0**11)
    assert report.max_rel_scale_error == pytest.approx(figures["dense_rel"], rel=1e-12)
    # one global per tensor (per expert): the max
    if experts is None:
        assert r.global_scale.shape == ()
        assert r.global_scale == np.float32(1.0)
    else:
        assert np.all(r.global_scale == np.float32(1.0))
        assert r.global_scale.shape == (2, 3)
    assert globals_differ(r) == 1.0
    # the first partition (g == g_max) is untouched
    assert np.array_equal(r.scales[..., :24, :], f.scales[..., :24, :])
    with pytest.raises(AttributeError):
        report.blocks_changed = 0  # type: ignore[misc]


def test_reconcile_keeps_zero_scales_and_small_error_without_underflow() -> None:
    rng = np.random.default_rng(8)
    a = random_planes(rng, (16, 64), g=1.0)
    b = random_planes(rng, (16, 64), g=0.75)
    b = b.replace(scales=np.clip(b.scales, 0x30, 0x7E).astype(np.uint8))
    b.scales[0, 0] = 0
    f = fuse([a, b], "gate_up")
    with pytest.warns(ReconcileWarning):
        r, report = reconcile_globals(f)
    assert r.scales[16, 0] == 0  # a zero scale stays zero
    assert report.underflowed_blocks == 0
    assert 0 < report.max_rel_scale_error <= 2.0**-4  # half an E4M3 step at most
    old, new = dequantize(f), dequantize(r)
    nz = old != 0
    rel = np.abs(new[nz] - old[nz]) / np.abs(old[nz])
    assert rel.max() <= report.max_rel_scale_error + 2.0**-22  # + float32 rounding


def test_reconcile_equal_or_unfused_is_lossless_and_silent() -> None:
    rng = np.random.default_rng(9)
    parts = [random_planes(rng, (4, 32), g=0.5) for _ in range(2)]
    f = fuse(parts, "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r, report = reconcile_globals(f)
        assert report == ReconcileReport(0, f.scales.size, 0.0, 0, 1.0)
        assert r.global_scale.shape == ()
        assert r.global_scale == np.float32(0.5)
        assert np.array_equal(r.scales, f.scales)
        same, report2 = reconcile_globals(parts[0])
        assert same is parts[0]
        assert report2.blocks_changed == 0
