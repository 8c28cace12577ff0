"""GGUF NVFP4 layout: the super-block byte format, byte-exact round trips, refusals, and
cross-checks against gguf-py's own NVFP4 dequantize and quantize."""

from __future__ import annotations

import numpy as np
import pytest
from layout_planes import random_planes
from nvfp4 import NVFP4Planes, PlaneError, dequantize
from nvfp4.layouts import GGUF_TYPE, from_gguf, to_gguf
from nvfp4.layouts import gguf as gguf_layout
from nvfp4.reference import pack_codes, unpack_codes


def every_code_every_scale() -> NVFP4Planes:
    rows = np.arange(0x7F)
    elems = (np.arange(128)[None, :] + rows[:, None]) % 16
    scales = np.repeat(rows.astype(np.uint8)[:, None], 8, axis=1)
    return NVFP4Planes(pack_codes(elems.astype(np.uint8)), scales, np.asarray(1.0, np.float32))


def expected_gguf_bytes(p: NVFP4Planes) -> np.ndarray:
    """The llama.cpp converter's repack, written independently: per 16-group, byte j holds
    element j (low) and j+8 (high); per 64 elements, 4 scale bytes then 32 code bytes."""
    elems = unpack_codes(p.codes)  # [..., N, K]
    lead = elems.shape[:-1]
    groups = elems.reshape(*lead, -1, 16)
    qs = groups[..., :8] | (groups[..., 8:] << 4)  # [..., K/16, 8]
    qs = qs.reshape(*lead, -1, 32)  # [..., K/64, 32]
    d = (p.scales & 0x7F).reshape(*lead, -1, 4)
    return np.concatenate([d, qs], axis=-1).reshape(*lead, -1)


def test_type_id() -> None:
    assert GGUF_TYPE == 40
    gguf = pytest.importorskip("gguf")
    assert int(gguf.GGMLQuantizationType.NVFP4) == GGUF_TYPE
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.NVFP4] == (64, 36)


@pytest.mark.parametrize("shape", [(1, 64), (5, 128), (33, 320), (3, 4, 192)])
def test_bytes_and_round_trip(shape: tuple[int, ...]) -> None:
    p = random_planes(np.random.default_rng(1), shape)
    data, scale = to_gguf(p)
    assert data.dtype == np.uint8
    assert data.shape == (*shape[:-1], shape[-1] // 64 * 36)
    assert np.array_equal(data, expected_gguf_bytes(p))
    assert scale.dtype == np.float32
    assert scale.shape == ((shape[0],) if len(shape) == 3 else (1,))
    assert np.array_equal(scale.reshape(p.global_scale.shape), p.global_scale)
    back = from_gguf(data, scale, name="w")
    assert np.array_equal(back.codes, p.codes)
    assert np.array_equal(back.scales, p.scales)
    assert np.array_equal(back.global_scale, p.global_scale)
    assert np.array_equal(dequantize(back), dequantize(p))


def test_chunking_covers_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_layout, "CHUNK_BYTES", 3 * 72)  # 3 rows of K = 128 per chunk
    p = random_planes(np.random.default_rng(2), (2, 11, 128))
    data, scale = to_gguf(p)
    assert np.array_equal(data, expected_gguf_bytes(p))
    chunks = list(gguf_layout.iter_gguf_data(p))
    assert [c.shape[0] for c in chunks] == [3, 3, 3, 2] * 2  # per expert, whole rows, in order
    assert np.array_equal(np.concatenate(chunks), data.reshape(-1, 72))
    pool = np.zeros(4096, dtype=np.uint8)  # a recycled buffer, as a streaming writer passes
    streamed = [c.copy() for c in gguf_layout.iter_gguf_data(p, buffer=lambda n: pool)]
    assert np.array_equal(np.concatenate(streamed), data.reshape(-1, 72))
    back = from_gguf(data, scale)
    assert np.array_equal(back.codes, p.codes)
    assert np.array_equal(back.scales, p.scales)


def test_non_contiguous_planes() -> None:
    p = random_planes(np.random.default_rng(3), (9, 256))
    view = NVFP4Planes(p.codes[::2, 32:96], p.scales[::2, 4:12], p.global_scale)
    data, _ = to_gguf(view)
    assert np.array_equal(data, expected_gguf_bytes(view))


def test_flat_data_with_k_and_missing_scale() -> None:
    p = random_planes(np.random.default_rng(4), (6, 128)).replace(global_scale=np.float32(1))
    data, _ = to_gguf(p)
    back = from_gguf(data.reshape(-1), None, k=128)
    assert back.global_scale == np.float32(1.0)  # llama.cpp omits a .scale of 1.0
    assert np.array_equal(back.codes, p.codes)
    with pytest.raises(PlaneError, match="GGUF data size"):
        from_gguf(data.reshape(-1)[:-1], None, k=128)
    with pytest.raises(PlaneError, match=r"GGUF row bytes.*K = 64"):
        from_gguf(data, None, k=64)


def test_expert_scale_shapes() -> None:
    p = random_planes(np.random.default_rng(5), (3, 2, 64))
    data, scale = to_gguf(p)
    assert scale.shape == (3,)
    one = from_gguf(data, np.array([0.5], np.float32))
    assert one.global_scale.shape == ()
    assert one.global_scale == np.float32(0.5)
    with pytest.raises(PlaneError, match=r"GGUF .scale shape"):
        from_gguf(data, np.ones(2, np.float32))
    # a stack of one expert (an expert-parallel rank's): its [1] .scale is that expert's
    single = random_planes(np.random.default_rng(8), (1, 2, 64))
    data1, scale1 = to_gguf(single)
    assert scale1.shape == (1,)
    back = from_gguf(data1, scale1)
    assert back.global_scale.shape == (1,)
    np.testing.assert_array_equal(back.global_scale, single.global_scale)


def test_refusals() -> None:
    p = random_planes(np.random.default_rng(6), (4, 48))
    with pytest.raises(
        PlaneError, match=r"K for GGUF NVFP4: expected a multiple of 64, found K = 48"
    ):
        to_gguf(p)
    q = random_planes(np.random.default_rng(7), (6, 128))
    fused = q.replace(partitions=(0, 2, 6), global_scale=np.array([0.5, 1.0], np.float32))
    with pytest.raises(PlaneError, match=r"per-partition globals.*2 partitions.*2x"):
        to_gguf(fused)
    equal = fused.replace(global_scale=np.array([0.5, 0.5], np.float32))
    _data, scale = to_gguf(equal)  # one global in fact: expressible
    assert scale.shape == (1,)
    assert scale[0] == np.float32(0.5)
    good, _ = to_gguf(q)
    for bad in (0x7F, 0x80, 0xFE):
        broken = good.copy()
        broken[1, 36 + 2] = bad  # scale byte 2 of the second super-block of row 1
        with pytest.raises(PlaneError, match=rf"scale byte at \(1, 6\).*0x{bad:02X}"):
            from_gguf(broken, None)
    with pytest.raises(PlaneError, match="GGUF row bytes"):
        from_gguf(good[:, :35], None)
    with pytest.raises(PlaneError, match="GGUF NVFP4 data dtype"):
        from_gguf(good.view(np.int8), None)


# ------------------------------------------------------------------------------ oracles
@pytest.mark.parametrize("case", ["all_codes_all_scales", "random", "experts"])
def test_gguf_py_dequantize_equals_ours_exactly(case: str) -> None:
    """gguf-py decodes our GGUF bytes to exactly our decode with global 1 (gguf-py ignores
    the .scale; it decodes 0x7F as 0 and ignores bit 7, so only valid bytes are fed)."""
    gguf = pytest.importorskip("gguf")
    if case == "all_codes_all_scales":
        p = every_code_every_scale()
    else:
        shape = (40, 256) if case == "random" else (2, 7, 128)
        p = random_planes(np.random.default_rng(8), shape)
    data, _ = to_gguf(p)
    theirs = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.NVFP4)
    ours = dequantize(p.replace(global_scale=np.ones_like(p.global_scale)))
    assert theirs.shape == ours.shape
    assert np.array_equal(theirs, ours)


def ggml_reference_quantize(gguf: object, x: np.ndarray) -> np.ndarray:
    """ggml's ``quantize_row_nvfp4_ref``, assembled from gguf-py's own NVFP4 primitives
    (``fp32_to_ue4m3``, ``ue4m3_to_fp32``, ``kvalues``): per 16-group the scale byte is
    ``fp32_to_ue4m3(amax / 6)``, each element the first argmin of ``|kvalue * d - x|``,
    packed element j low / j+8 high, and 4 scale bytes before 32 code bytes per 64."""
    nv = gguf.quants.NVFP4  # type: ignore[attr-defined]
    n, k = x.shape
    groups = x.reshape(n, k // 16, 16)
    ue = nv.fp32_to_ue4m3(np.abs(groups).max(axis=-1) / np.float32(6.0))
    d = nv.ue4m3_to_fp32(ue)[..., None, None]  # [n, k/16, 1, 1]
    kv = np.array(nv.kvalues, dtype=np.float32)  # [16]
    idx = np.argmin(np.abs(kv * d - groups[..., None]), axis=-1).astype(np.uint8)
    qs = (idx[..., :8] | (idx[..., 8:] << 4)).reshape(n, k // 64, 32)
    return np.concatenate([ue.reshape(n, k // 64, 4), qs], axis=-1).reshape(n, -1)


def test_gguf_quantized_tensor_decodes_identically(capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes written by ggml's NVFP4 quantizer (gguf-py's ``quantize`` when it implements
    NVFP4; gguf 0.19 only decodes it, so then ggml's reference assembled from gguf-py's
    primitives) load through from_gguf, decode exactly as gguf-py decodes them, and go
    back to the very same bytes."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((33, 256)) * np.exp2(rng.uniform(-8, 4, size=(33, 1)))).astype(
        np.float32
    )
    x[3, :64] = 0.0  # an all-zero super-block
    try:
        data = gguf.quants.quantize(x, gguf.GGMLQuantizationType.NVFP4)
        source = "gguf.quants.quantize"
    except NotImplementedError:
        data = ggml_reference_quantize(gguf, x)
        source = "ggml reference from gguf-py primitives"
    with capsys.disabled():
        print(f"\n[gguf quantized bytes] from {source}")
    p = from_gguf(data, None, name="ggml")
    theirs = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.NVFP4)
    assert np.array_equal(dequantize(p), theirs)
    assert np.max(np.abs(theirs - x)) <= np.max(np.abs(x)) / 4  # a real quantization of x
    again, scale = to_gguf(p)
    assert np.array_equal(again, data)
    assert scale[0] == np.float32(1.0)
