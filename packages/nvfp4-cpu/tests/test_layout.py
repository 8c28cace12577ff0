"""prepare(): validation, the tiled layout (against a numpy definition), the inverse."""

from __future__ import annotations

import numpy as np
import nvfp4
import pytest
from nvfp4 import PlaneError
from nvfp4_cpu import CPUBackend, CPUKernels, PreparedWeight
from nvfp4_cpu._native import Native
from nvfp4_cpu.layout import TILE, prepare, tile_layout_reference


def _random_planes(
    rng: np.random.Generator, shape: tuple[int, ...], **kw: object
) -> nvfp4.NVFP4Planes:
    return nvfp4.quantize(rng.standard_normal(shape).astype(np.float32), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(1, 16), (7, 48), (16, 32), (33, 64), (3, 20, 32)])
def test_tiled_layout_matches_numpy_definition_and_round_trips(
    native: Native, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(sum(shape))
    p = _random_planes(rng, shape)
    pw = prepare(p, native, threads=2)
    codes, scales = tile_layout_reference(p)
    np.testing.assert_array_equal(pw.codes, codes)
    np.testing.assert_array_equal(pw.scales, scales)
    assert pw.codes.ctypes.data % 64 == 0
    assert pw.scales.ctypes.data % 64 == 0
    # padding rows decode to zero and carry a zero global
    n = shape[-2]
    tiles = -(-n // TILE)
    assert pw.tiles == tiles
    assert pw.row_global.shape == (pw.experts, tiles * TILE)
    assert not pw.row_global[:, n:].any()
    np.testing.assert_array_equal(pw.row_global[:, :n], p.row_global().reshape(pw.experts, n))
    back = pw.to_planes(native, threads=2)
    assert back.shape == p.shape
    assert back.name == p.name
    np.testing.assert_array_equal(back.codes, p.codes)
    np.testing.assert_array_equal(back.scales, p.scales)
    np.testing.assert_array_equal(back.global_scale, p.global_scale)


def test_partitions_and_expert_globals_become_row_globals(native: Native) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((2, 10, 32)).astype(np.float32)
    p = nvfp4.quantize(w, partitions=(0, 4, 10))
    assert p.global_scale.shape == (2, 2)
    pw = prepare(p, native)
    assert pw.partitions == (0, 4, 10)
    np.testing.assert_array_equal(pw.row_global[0, :4], np.full(4, p.global_scale[0, 0]))
    np.testing.assert_array_equal(pw.row_global[1, 4:10], np.full(6, p.global_scale[1, 1]))
    assert CPUKernels().to_planes(pw).partitions == (0, 4, 10)


@pytest.mark.parametrize("byte", [0x7F, 0x80, 0xFF])
def test_prepare_refuses_invalid_scale_bytes(byte: int) -> None:
    p = nvfp4.quantize(np.ones((3, 32), np.float32), name="w.bad")
    scales = p.scales.copy()
    scales[2, 1] = byte
    bad = p.replace(scales=scales)
    with pytest.raises(PlaneError, match=r"'w.bad'.*scale byte at \(2, 1\)"):
        CPUBackend().prepare(bad)
    # the matmul verbs validate the same way when handed raw planes
    with pytest.raises(PlaneError):
        CPUBackend().qmm(np.ones((1, 32), np.float32), bad)


@pytest.mark.parametrize("g", [0.0, -1.0, np.inf, np.nan])
def test_prepare_refuses_bad_globals(g: float) -> None:
    p = nvfp4.quantize(np.ones((3, 32), np.float32))
    with pytest.raises(PlaneError, match="global_scale"):
        CPUBackend().prepare(p.replace(global_scale=np.float32(g)))


def test_prepare_refuses_non_planes_and_verbs_refuse_foreign_handles() -> None:
    b = CPUBackend()
    with pytest.raises(PlaneError, match="planes type"):
        b.prepare(np.zeros((2, 8), np.uint8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Frontend\.prepare"):
        b.qmm(np.ones((1, 16), np.float32), {"codes": 1})


def test_prepared_weight_facts(native: Native) -> None:
    p = _random_planes(np.random.default_rng(2), (4, 33, 48))
    pw = prepare(p, native)
    assert isinstance(pw, PreparedWeight)
    assert pw.shape == (4, 33, 48)
    assert pw.num_experts == 4
    assert pw.experts == 4
    assert pw.nbytes == pw.codes.nbytes + pw.scales.nbytes + pw.row_global.nbytes


def test_hand_built_prepared_weights_are_checked(native: Native) -> None:
    """A PreparedWeight whose arrays disagree with n, k is refused before any kernel runs."""
    import dataclasses

    pw = prepare(_random_planes(np.random.default_rng(3), (20, 32)), native)
    with pytest.raises(PlaneError, match="prepared codes"):
        dataclasses.replace(pw, codes=pw.codes[:, :1].copy())
    with pytest.raises(PlaneError, match="prepared codes"):
        dataclasses.replace(pw, k=64)  # k disagrees with the arrays
    with pytest.raises(PlaneError, match="prepared scales"):
        dataclasses.replace(pw, scales=pw.scales[:, :, :1].copy())
    with pytest.raises(PlaneError, match="prepared row_global"):
        dataclasses.replace(pw, row_global=pw.row_global.astype(np.float64))
    with pytest.raises(PlaneError, match="C-contiguous"):
        dataclasses.replace(pw, row_global=np.asfortranarray(np.repeat(pw.row_global, 2, 0))[:1])
    with pytest.raises(PlaneError, match="prepared n, k"):
        dataclasses.replace(pw, n=0)
