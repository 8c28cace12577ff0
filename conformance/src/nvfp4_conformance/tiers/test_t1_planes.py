"""T1 planes and layouts.

* Malformed planes: :class:`nvfp4.NVFP4Planes` refuses a structurally malformed plane when
  it is made; ``backend.prepare`` refuses every malformed plane (structure and content), and
  every verb refuses a structurally malformed one, each with :class:`nvfp4.PlaneError`
  naming the tensor. Inputs that do not fit the weight (``x`` of the wrong K) are refused
  with a ``ValueError``.
* Layouts: every transcoder of :mod:`nvfp4.layouts` and :mod:`nvfp4.fusion` round-trips
  byte for byte (the compressed-tensors global within 1 ulp, as spec 1.0 allows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from nvfp4 import fusion, layouts
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import swizzle_128x4_offset

from nvfp4_conformance.cases import (
    MalformedCase,
    content_malformed_cases,
    random_planes,
    structural_malformed_cases,
)

STRUCTURAL = structural_malformed_cases()
CONTENT = content_malformed_cases()


def _refusals(
    call: Callable[[MalformedCase], Any], cases: list[MalformedCase]
) -> tuple[list[str], list[str]]:
    """Run ``call`` on every case; return the cases accepted and those refused badly."""
    accepted, bad = [], []
    for case in cases:
        try:
            call(case)
        except PlaneError as exc:
            if case.planes.name not in str(exc):
                bad.append(
                    f"{case.id}: the PlaneError does not name tensor {case.planes.name!r}: {exc}"
                )
        except Exception as exc:
            bad.append(f"{case.id}: {type(exc).__name__} instead of nvfp4.PlaneError: {exc}")
        else:
            accepted.append(case.id)
    return accepted, bad


def _assert_refused(what: str, accepted: list[str], bad: list[str]) -> None:
    msg = []
    if accepted:
        msg.append(f"{what} accepted malformed planes: {', '.join(accepted)}")
    if bad:
        msg.append(
            f"{what} refused malformed planes without a proper PlaneError:\n  " + "\n  ".join(bad)
        )
    assert not msg, "\n".join(msg)


def test_constructor_refuses_malformed_structure(nvfp4_record: Any) -> None:
    """The installed nvfp4-core's NVFP4Planes refuses every structural case when made."""

    def make(case: MalformedCase) -> None:
        p = case.planes
        NVFP4Planes(p.codes, p.scales, p.global_scale, p.partitions, p.name)

    accepted, bad = _refusals(make, STRUCTURAL)
    nvfp4_record(
        "structural cases", cases=len(STRUCTURAL), accepted=len(accepted), bad_errors=len(bad)
    )
    _assert_refused("NVFP4Planes()", accepted, bad)


def test_prepare_refuses_malformed_structure(nvfp4_backend: Any, nvfp4_record: Any) -> None:
    accepted, bad = _refusals(lambda c: nvfp4_backend.prepare(c.planes), STRUCTURAL)
    nvfp4_record(
        "structural cases", cases=len(STRUCTURAL), accepted=len(accepted), bad_errors=len(bad)
    )
    _assert_refused("prepare", accepted, bad)


def test_prepare_refuses_malformed_content(nvfp4_backend: Any, nvfp4_record: Any) -> None:
    """Scale bytes with bit 7 set or 0x7F, globals that are zero, negative, NaN or Inf."""
    accepted, bad = _refusals(lambda c: nvfp4_backend.prepare(c.planes), CONTENT)
    nvfp4_record("content cases", cases=len(CONTENT), accepted=len(accepted), bad_errors=len(bad))
    _assert_refused("prepare", accepted, bad)


def _x(backend: Any, case: MalformedCase, rows: int = 3) -> Any:
    return backend.from_numpy(np.ones((rows, case.k), dtype=np.float32))


VERB_CALLS: dict[str, Callable[[Any, MalformedCase], Any]] = {
    "qmm": lambda b, c: b.qmm(_x(b, c), c.planes),
    "dequantize": lambda b, c: b.dequantize(c.planes, "float32"),
    "gather_qmm": lambda b, c: b.gather_qmm(
        _x(b, c), c.planes, b.from_numpy(np.zeros(3, np.int32))
    ),
    "w4a4": lambda b, c: b.qmm_w4a4(_x(b, c), c.planes),
}


@pytest.mark.parametrize(
    "verb",
    [pytest.param(v, marks=pytest.mark.requires_capability(v), id=v) for v in VERB_CALLS],
)
def test_verbs_refuse_malformed_structure(nvfp4_backend: Any, nvfp4_record: Any, verb: str) -> None:
    """A verb handed raw, structurally malformed planes (not a prepared handle) validates
    them before any kernel reads a byte. ``gather_qmm`` gets the expert-stacked cases."""
    if verb == "gather_qmm":
        cases = [c for c in STRUCTURAL if c.experts]
    else:
        cases = [c for c in STRUCTURAL if not c.experts]
    call = VERB_CALLS[verb]
    accepted, bad = _refusals(lambda c: call(nvfp4_backend, c), cases)
    nvfp4_record(
        f"{verb}: structural cases", cases=len(cases), accepted=len(accepted), bad_errors=len(bad)
    )
    _assert_refused(verb, accepted, bad)


@pytest.mark.requires_capability("qmm")
def test_qmm_refuses_x_of_wrong_k(nvfp4_backend: Any) -> None:
    rng = np.random.default_rng(11)
    w = nvfp4_backend.prepare(random_planes(rng, 8, 64, name="t1_wrong_k"))
    with pytest.raises(ValueError):
        nvfp4_backend.qmm(nvfp4_backend.from_numpy(np.ones((2, 48), np.float32)), w)


@pytest.mark.requires_capability("gather_qmm")
def test_gather_qmm_refuses_x_of_wrong_k(nvfp4_backend: Any) -> None:
    rng = np.random.default_rng(12)
    w = nvfp4_backend.prepare(random_planes(rng, 8, 64, experts=2, name="t1_wrong_k_moe"))
    ids = nvfp4_backend.from_numpy(np.zeros(2, np.int32))
    with pytest.raises(ValueError):
        nvfp4_backend.gather_qmm(nvfp4_backend.from_numpy(np.ones((2, 48), np.float32)), w, ids)


@pytest.mark.requires_capability("quantize_activations")
def test_quantize_activations_refuses_k_not_multiple_of_16(nvfp4_backend: Any) -> None:
    with pytest.raises(ValueError):
        nvfp4_backend.quantize_activations(nvfp4_backend.from_numpy(np.ones((2, 24), np.float32)))


# ---------------------------------------------------------------------------- layouts
def _layout_planes() -> list[tuple[str, NVFP4Planes]]:
    rng = np.random.default_rng(1234)
    return [
        ("2d_n7_k64", random_planes(rng, 7, 64, name="l.2d")),
        ("2d_n130_k192", random_planes(rng, 130, 192, name="l.2d_big")),
        ("experts3_n9_k128", random_planes(rng, 9, 128, experts=3, name="l.moe")),
        ("2d_n1_k4096", random_planes(rng, 1, 4096, name="l.row")),
    ]


LAYOUT_PLANES = _layout_planes()


def _same_planes(a: NVFP4Planes, b: NVFP4Planes, what: str, *, global_ulps: int = 0) -> int:
    """Assert byte-identical codes and scales, equal partitions, and globals within
    ``global_ulps`` float32 ulps; return the largest ulp distance of the globals."""
    assert a.codes.dtype == b.codes.dtype == np.uint8, f"{what}: codes dtype {b.codes.dtype}"
    assert a.codes.shape == b.codes.shape, (
        f"{what}: codes shape {b.codes.shape}, expected {a.codes.shape}"
    )
    diff = np.argwhere(a.codes != b.codes)
    assert diff.size == 0, f"{what}: {len(diff)} code bytes differ, first at {tuple(diff[0])}"
    assert a.scales.shape == b.scales.shape, (
        f"{what}: scales shape {b.scales.shape}, expected {a.scales.shape}"
    )
    diff = np.argwhere(a.scales != b.scales)
    assert diff.size == 0, f"{what}: {len(diff)} scale bytes differ, first at {tuple(diff[0])}"
    assert a.partitions == b.partitions, (
        f"{what}: partitions {b.partitions}, expected {a.partitions}"
    )
    ga = np.broadcast_to(
        a.global_scale, np.broadcast_shapes(a.global_scale.shape, b.global_scale.shape)
    )
    gb = np.broadcast_to(b.global_scale, ga.shape)
    ulps = int(
        np.max(
            np.abs(ga.view(np.int32).astype(np.int64) - gb.view(np.int32).astype(np.int64)),
            initial=0,
        )
    )
    assert ulps <= global_ulps, (
        f"{what}: globals differ by {ulps} ulp: {gb} vs {ga} (allowed {global_ulps})"
    )
    return ulps


@pytest.mark.parametrize(("label", "planes"), LAYOUT_PLANES, ids=[c[0] for c in LAYOUT_PLANES])
def test_modelopt_round_trip(nvfp4_record: Any, label: str, planes: NVFP4Planes) -> None:
    back = layouts.from_modelopt(layouts.to_modelopt(planes), planes.name)
    nvfp4_record(label, global_ulps=_same_planes(planes, back, "ModelOpt round trip"))


@pytest.mark.parametrize(("label", "planes"), LAYOUT_PLANES, ids=[c[0] for c in LAYOUT_PLANES])
def test_compressed_tensors_round_trip(nvfp4_record: Any, label: str, planes: NVFP4Planes) -> None:
    back = layouts.from_compressed_tensors(layouts.to_compressed_tensors(planes), planes.name)
    ulps = _same_planes(planes, back, "compressed-tensors round trip", global_ulps=1)
    nvfp4_record(label, global_ulps=ulps)


@pytest.mark.parametrize(("label", "planes"), LAYOUT_PLANES, ids=[c[0] for c in LAYOUT_PLANES])
def test_mlx_round_trip(nvfp4_record: Any, label: str, planes: NVFP4Planes) -> None:
    mp = layouts.to_mlx(planes)
    assert mp.weight.dtype.itemsize == 4
    assert mp.weight.shape[-1] == planes.k // 8
    back = layouts.from_mlx(mp)
    nvfp4_record(label, global_ulps=_same_planes(planes, back, "MLX round trip"))


@pytest.mark.parametrize(("label", "planes"), LAYOUT_PLANES, ids=[c[0] for c in LAYOUT_PLANES])
def test_gguf_round_trip(nvfp4_record: Any, label: str, planes: NVFP4Planes) -> None:
    data, scale = layouts.to_gguf(planes)
    assert data.shape[-1] == planes.k // 64 * 36, f"GGUF row bytes {data.shape[-1]}"
    back = layouts.from_gguf(data, scale, planes.name)
    nvfp4_record(label, global_ulps=_same_planes(planes, back, "GGUF round trip"))


def test_gguf_refuses_k_not_multiple_of_64() -> None:
    rng = np.random.default_rng(5)
    planes = random_planes(rng, 4, 48, name="gguf_k48")
    with pytest.raises(PlaneError, match="gguf_k48"):
        layouts.to_gguf(planes)


@pytest.mark.parametrize(("label", "planes"), LAYOUT_PLANES, ids=[c[0] for c in LAYOUT_PLANES])
def test_swizzle_round_trip_and_offsets(nvfp4_record: Any, label: str, planes: NVFP4Planes) -> None:
    """128x4 swizzle: every scale byte lands at ``spec.swizzle_128x4_offset``, pad bytes
    are zero, and unswizzling gives the bytes back."""
    n, kb = planes.n, planes.k // 16
    buf = layouts.swizzle_scales(planes.scales, planes.name)
    back = layouts.unswizzle_scales(buf, n, kb, planes.name)
    np.testing.assert_array_equal(back, planes.scales, err_msg="128x4 swizzle round trip")
    rows, cols = np.meshgrid(np.arange(n), np.arange(kb), indexing="ij")
    offsets = swizzle_128x4_offset(rows, cols, kb)
    flat = buf.reshape(*planes.scales.shape[:-2], -1)
    placed = flat[..., offsets]
    np.testing.assert_array_equal(
        placed, planes.scales, err_msg="scale bytes not at spec.swizzle_128x4_offset"
    )
    pad = np.ones(flat.shape[-1], dtype=bool)
    pad[offsets.reshape(-1)] = False
    assert not flat[..., pad].any(), "128x4 swizzle pad bytes must be zero"
    nvfp4_record(label, buffer_bytes=int(flat.shape[-1]), pad_bytes=int(pad.sum()))


def test_fuse_unfuse_round_trip(nvfp4_record: Any) -> None:
    """q/k/v fused along N keep one global per partition; unfuse gives the parts back."""
    rng = np.random.default_rng(77)
    parts = [random_planes(rng, n, 64, name=f"p{i}") for i, n in enumerate((16, 8, 8))]
    fused = fusion.fuse(parts, "qkv")
    assert fused.partitions == (0, 16, 24, 32), f"partitions {fused.partitions}"
    back = fusion.unfuse(fused, [p.name for p in parts])
    for p, b in zip(parts, back, strict=True):
        _same_planes(p, b, f"unfuse({p.name})")
    nvfp4_record("qkv 16+8+8 x 64", partitions=list(fused.partitions))


def test_stack_unstack_experts_round_trip(nvfp4_record: Any) -> None:
    rng = np.random.default_rng(78)
    parts = [random_planes(rng, 12, 32, name=f"e{i}") for i in range(4)]
    stacked = fusion.stack_experts(parts, "experts")
    assert stacked.num_experts == 4
    assert stacked.global_scale.shape == (4,)
    back = fusion.unstack_experts(stacked, [p.name for p in parts])
    for p, b in zip(parts, back, strict=True):
        _same_planes(p, b, f"unstack_experts({p.name})")
    nvfp4_record("4 experts 12 x 32", experts=4)
