"""The reference's entry points validate content as the spec's "Validation" section says:
invalid scale bytes and globals are refused, never decoded to NaN or sign-flipped values,
and a huge broadcast (stride-0) plane is a PlaneError, never a MemoryError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import nvfp4
import nvfp4.fusion
import pytest
from nvfp4.planes import NVFP4Planes, PlaneError, validate


def _planes(experts: bool = False) -> NVFP4Planes:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 32, 64) if experts else (32, 64)).astype(np.float32)
    if experts:
        return nvfp4.fusion.stack_experts(
            [nvfp4.quantize(w[0]), nvfp4.quantize(w[1])], name="experts"
        )
    return nvfp4.quantize(w)


X = np.ones((2, 64), dtype=np.float32)
VERBS: dict[str, Callable[[NVFP4Planes], Any]] = {
    "nvfp4.dequantize": lambda p: nvfp4.dequantize(p),
    "reference.dequantize": lambda p: nvfp4.reference.dequantize(p),
    "reference.qmm": lambda p: nvfp4.reference.qmm(X, p),
    "reference.gather_qmm": lambda p: nvfp4.reference.gather_qmm(X, p, np.array([0, 1])),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize(
    "case", ["scale 0xFF", "scale 0x7F", "global NaN", "global 0", "global -inf"]
)
def test_reference_refuses_invalid_content(verb: str, case: str) -> None:
    p = _planes(experts=verb == "reference.gather_qmm")
    if case.startswith("scale"):
        scales = np.array(p.scales)
        scales.reshape(-1)[5] = int(case.split()[1], 16)
        bad = p.replace(scales=scales)
    else:
        value = {"global NaN": np.nan, "global 0": 0.0, "global -inf": -np.inf}[case]
        bad = p.replace(global_scale=np.full_like(p.global_scale, value))
    with pytest.raises(PlaneError, match=r"scale byte|global_scale"):
        VERBS[verb](bad)


def test_huge_broadcast_planes_are_plane_errors() -> None:
    n, k = 2**20, 2**20
    huge = NVFP4Planes(
        codes=np.broadcast_to(np.zeros((1, 1), np.uint8), (n, k // 2)),
        scales=np.broadcast_to(np.full((1, 1), 0x38, np.uint8), (n, k // 16)),
        global_scale=np.float32(1.0),
    )
    validate(huge, content=True)  # checked in the memory it really holds
    bad = huge.replace(scales=np.broadcast_to(np.full((1, 1), 0xFF, np.uint8), (n, k // 16)))
    with pytest.raises(PlaneError, match="scale byte at \\(0, 0\\)"):
        validate(bad, content=True)
    with pytest.raises(PlaneError, match="decoded size"):
        nvfp4.dequantize(huge)


def huge_planes(kind: str, experts: bool = False) -> NVFP4Planes:
    """Planes of a logical size of terabytes in a few bytes: every axis broadcast
    (``np.broadcast_to``, zero strides) or rows overlapping (``as_strided``, stride 1)."""
    n = k = 2**23  # codes 32 TiB, the float32 decode 256 TiB
    lead = (2,) if experts else ()
    if kind == "broadcast":
        codes = np.broadcast_to(np.zeros((1, 1), np.uint8), (*lead, n, k // 2))
        scales = np.broadcast_to(np.full((1, 1), 0x38, np.uint8), (*lead, n, k // 16))
    else:
        strided = np.lib.stride_tricks.as_strided
        codes = strided(np.zeros(k, np.uint8), (*lead, n, k // 2), (0, 1, 1)[-2 - len(lead) :])
        scales = strided(
            np.full(k, 0x38, np.uint8), (*lead, n, k // 16), (0, 1, 1)[-2 - len(lead) :]
        )
    g = np.ones(lead, np.float32) if experts else np.float32(1.0)
    return NVFP4Planes(codes=codes, scales=scales, global_scale=g, name="huge")


HUGE_VERBS: dict[str, Callable[[NVFP4Planes, Any], Any]] = {
    "reference.dequantize": lambda p, x: nvfp4.reference.dequantize(p),
    "reference.qmm": lambda p, x: nvfp4.reference.qmm(x, p),
    "nvfp4.dequantize": lambda p, x: nvfp4.dequantize(p),
    "nvfp4.qmm": lambda p, x: nvfp4.qmm(x, p),
    "backend.prepare": lambda p, x: nvfp4.get_backend("reference").prepare(p),
    "backend.dequantize": lambda p, x: nvfp4.get_backend("reference").dequantize(p),
    "backend.qmm": lambda p, x: nvfp4.get_backend("reference").qmm(x, p),
}


def refused_quickly(call: Callable[[], Any], what: str = "(decoded|planes)") -> tuple[float, int]:
    """``call()`` raises a PlaneError naming a size of bytes; its seconds and the peak of
    the memory it allocated (tracemalloc, numpy's arrays included)."""
    import time
    import tracemalloc

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(PlaneError, match=rf"^tensor 'huge': {what} size: expected .* bytes$"):
            call()
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return seconds, peak


@pytest.mark.parametrize("kind", ["broadcast", "overlapping"])
@pytest.mark.parametrize("verb", sorted(HUGE_VERBS))
def test_terabyte_planes_are_refused_before_any_allocation(verb: str, kind: str) -> None:
    """The size is checked in O(1) before anything is copied, decoded or read: a PlaneError
    naming the size, in well under a second and a megabyte."""
    p = huge_planes(kind)
    x = np.ones((1, 2**23), np.float32)
    seconds, peak = refused_quickly(lambda: HUGE_VERBS[verb](p, x))
    assert seconds < 1.0
    assert peak < 2**20


def test_overlapping_scales_are_refused_by_validate_before_they_are_read() -> None:
    """Content validation reads broadcast axes once; rows that overlap (stride 1) cannot be
    reduced so, and a check of 4 TiB of scale bytes is refused in O(1) naming the size."""
    p = huge_planes("overlapping")
    seconds, peak = refused_quickly(lambda: validate(p, content=True), "scales")
    assert seconds < 1.0
    assert peak < 2**20
