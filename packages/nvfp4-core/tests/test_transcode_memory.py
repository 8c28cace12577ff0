"""Transcodes never build a dense matrix: their peak memory (tracemalloc) on a 14336 x 4096
weight stays near the size of the planes (33 MB), far below the dense float32 matrix
(235 MB). The planes are built from random bytes, never by quantizing a dense matrix."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from nvfp4 import NVFP4Planes
from nvfp4.layouts import (
    from_gguf,
    from_mlx,
    swizzle_scales,
    to_compressed_tensors,
    to_gguf,
    to_mlx,
    to_modelopt,
    unswizzle_scales,
)

N, K = 14336, 4096
DENSE_F32_BYTES = N * K * 4


@pytest.fixture(scope="module")
def planes() -> NVFP4Planes:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(N, K // 16), dtype=np.uint8)
    return NVFP4Planes(codes, scales, np.asarray(0.01, np.float32), name="big")


def peak_of(fn: Callable[[], Any]) -> tuple[Any, int, float]:
    """(result, bytes allocated at the peak above what was live before, seconds)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak - before, seconds


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Iterator[list[str]]:
    """Lines of measured figures, printed (uncaptured) after the test."""
    lines: list[str] = []
    yield lines
    with capsys.disabled():
        print("".join(f"\n[transcode memory] {line}" for line in lines))


def record(lines: list[str], what: str, peak: int, ref: int, seconds: float) -> None:
    lines.append(
        f"{what:<28} peak {peak / 1e6:7.2f} MB = {peak / ref:5.3f}x planes "
        f"({peak / DENSE_F32_BYTES:5.3f}x dense f32), {seconds:.3f} s"
    )


def test_gguf_transcodes_peak_near_planes_size(planes: NVFP4Planes, report: list[str]) -> None:
    ref = planes.nbytes
    (data, scale), up, t_up = peak_of(lambda: to_gguf(planes))
    record(report, "to_gguf", up, ref, t_up)
    back, down, t_down = peak_of(lambda: from_gguf(data, scale))
    record(report, "from_gguf", down, ref, t_down)
    _, both, t_both = peak_of(lambda: from_gguf(*to_gguf(planes)))
    record(report, "from_gguf(to_gguf) chained", both, ref, t_both)
    # each direction allocates its output (the same size as the planes) and small chunks
    assert data.nbytes == pytest.approx(ref, rel=0.01)
    assert up <= 1.5 * ref
    assert down <= 1.5 * ref
    # chained, both outputs are alive at once: still nowhere near the dense matrix
    assert both <= 2.5 * ref < 0.4 * DENSE_F32_BYTES
    assert np.array_equal(back.codes, planes.codes)
    assert np.array_equal(back.scales, planes.scales)


def test_view_transcodes_copy_nothing(planes: NVFP4Planes, report: list[str]) -> None:
    ref = planes.nbytes
    for what, fn in (
        ("to_mlx", lambda: to_mlx(planes)),
        ("to_compressed_tensors", lambda: to_compressed_tensors(planes)),
        ("to_modelopt", lambda: to_modelopt(planes)),
    ):
        _out, peak, seconds = peak_of(fn)
        record(report, what, peak, ref, seconds)
        assert peak <= 0.5 * ref  # content validation's temporaries only
    m = to_mlx(planes)
    assert np.shares_memory(m.weight, planes.codes)
    back, peak, seconds = peak_of(lambda: from_mlx(m))
    record(report, "from_mlx", peak, ref, seconds)
    assert peak <= 0.5 * ref
    assert np.shares_memory(back.codes, planes.codes)


def test_swizzle_peak_near_scales_size(planes: NVFP4Planes, report: list[str]) -> None:
    ref = planes.nbytes
    buf, peak, seconds = peak_of(lambda: swizzle_scales(planes.scales))
    record(report, "swizzle_scales", peak, ref, seconds)
    assert peak <= 3 * planes.scales.nbytes <= 2.0 * ref
    back, peak2, seconds2 = peak_of(lambda: unswizzle_scales(buf, N, K // 16))
    record(report, "unswizzle_scales", peak2, ref, seconds2)
    assert peak2 <= 3 * planes.scales.nbytes
    assert np.array_equal(back, planes.scales)
