"""Bounded memory: planes whose strides claim terabytes in a few bytes (every axis
broadcast with zero strides, or rows overlapping with stride 1) are refused by core's front
end with a PlaneError naming the size, before the cpu backend copies, tiles or decodes
anything: never a MemoryError, never a long wait."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import nvfp4
import pytest
from nvfp4.planes import NVFP4Planes, PlaneError

K = 2**23  # N = K = 2**23: codes 32 TiB, the float32 decode 256 TiB


def huge_planes(kind: str, experts: bool) -> NVFP4Planes:
    lead = (2,) if experts else ()
    strides = (0, 1, 1)[-2 - len(lead) :]
    if kind == "broadcast":
        codes = np.broadcast_to(np.zeros((1, 1), np.uint8), (*lead, K, K // 2))
        scales = np.broadcast_to(np.full((1, 1), 0x38, np.uint8), (*lead, K, K // 16))
    else:
        strided = np.lib.stride_tricks.as_strided
        codes = strided(np.zeros(K, np.uint8), (*lead, K, K // 2), strides)
        scales = strided(np.full(K, 0x38, np.uint8), (*lead, K, K // 16), strides)
    g = np.ones(lead, np.float32) if experts else np.float32(1.0)
    return NVFP4Planes(codes=codes, scales=scales, global_scale=g, name="huge")


VERBS: dict[str, Callable[[nvfp4.Frontend, NVFP4Planes, Any], Any]] = {
    "prepare": lambda b, p, x: b.prepare(p),
    "dequantize": lambda b, p, x: b.dequantize(p),
    "dequantize float16": lambda b, p, x: b.dequantize(p, "float16"),
    "qmm": lambda b, p, x: b.qmm(x, p),
    "gather_qmm": lambda b, p, x: b.gather_qmm(x, p, np.array([1])),
    "qmm_w4a8": lambda b, p, x: b.qmm_w4a8(x, p),
}


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("kind", ["broadcast", "overlapping"])
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_terabyte_planes_are_refused_before_any_allocation(
    backend: str, kind: str, verb: str
) -> None:
    b = nvfp4.get_backend(backend)
    p = huge_planes(kind, experts=verb == "gather_qmm")
    x = np.ones((1, K), np.float32)
    what = "decoded" if verb.startswith("dequantize") else "planes"
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(PlaneError, match=rf"^tensor 'huge': {what} size: expected .* bytes$"):
            VERBS[verb](b, p, x)
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert seconds < 1.0, seconds
    assert peak < 2**20, peak


def test_a_prepared_weight_too_big_to_decode_is_refused_before_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A weight that prepares (its planes fit) but whose float32 decode would not: the
    front end refuses dequantize with the reference's message before the kernel allocates
    its output."""
    rng = np.random.default_rng(0)
    w = nvfp4.quantize(rng.standard_normal((64, 64)).astype(np.float32), name="huge")
    pw = nvfp4.get_backend("cpu").prepare(w)
    monkeypatch.setattr(nvfp4.planes, "memory_bytes", lambda: 64 * 64 * 4 - 1)
    with pytest.raises(PlaneError, match=r"^tensor 'huge': decoded size: expected a weight"):
        pw.backend.dequantize(pw)
