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
