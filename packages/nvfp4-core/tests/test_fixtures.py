"""The committed golden fixtures (``nvfp4/fixtures/data``).

1. The generator reproduces every committed file and the manifest byte for byte.
2. Every committed file matches the sha256 in the manifest.
3. Every case is re-checked semantically: the reference encoder reproduces its planes; an
   independent encoder built on ``ml_dtypes`` (``float8_e4m3fn`` / ``float4_e2m1fn``
   casts, round-to-nearest-even) reproduces its global, scale bytes and codes; decoding
   matches the reference and ``ml_dtypes``; every layout reproduces its bytes (and
   gguf-py / MLX decode them to the same values); matmul outputs are within
   ``nvfp4.tolerances`` (and equal to the reference's float32 result).
4. The W4A8 cases (spec 1.1) against independent oracles: gguf-py's Q8_0 quantizer (which
   the spec's int8 rule is bit-identical to) for the int8 codes and ``d``, ``ml_dtypes``'
   ``float8_e4m3fn`` cast for the FP8 codes, and ggml's integer dot product
   (``ggml_vec_dot_nvfp4_q8_0``: per 16-block integer sums of ``2 * e2m1`` times the
   codes) for the int8 matmuls.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from generate_fixtures import OP_MIN_SPEC, Q8_MARGIN, STORED_DTYPES, generate
from nvfp4 import fixtures, reference
from nvfp4.fixtures import data_files, list_cases, load_case, manifest
from nvfp4.fusion import fuse, unfuse
from nvfp4.layouts.compressed_tensors import from_compressed_tensors, to_compressed_tensors
from nvfp4.layouts.gguf import from_gguf, to_gguf
from nvfp4.layouts.mlx import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from nvfp4.layouts.swizzle import swizzle_scales, unswizzle_scales
from nvfp4.planes import NVFP4Planes, PlaneError, expand_row_global
from nvfp4.spec import (
    GLOBAL_AMAX_DIVISOR,
    SPEC_VERSION,
    swizzle_128x4_offset,
    swizzled_scale_shape,
    version_key,
)
from nvfp4.testing import assert_within

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
F32 = np.float32
Arrays = dict[str, npt.NDArray[Any]]

CASES = list_cases()
NAMES = [c["name"] for c in CASES]
BY_NAME = {c["name"]: c for c in CASES}
WEIGHT_CASES = [n for n in NAMES if "input" in BY_NAME[n]["arrays"]]
LAYOUT_FUNCS = {"to_gguf": to_gguf, "to_compressed_tensors": to_compressed_tensors}


def committed(name: str) -> bytes:
    return data_files().joinpath(name).read_bytes()


def bits(a: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """Raw bytes, so NaN, inf and -0.0 compare exactly."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_bytes_equal(got: npt.NDArray[Any], want: npt.NDArray[Any], what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype.itemsize == want.dtype.itemsize, f"{what}: {got.dtype} vs {want.dtype}"
    diff = np.flatnonzero(bits(got) != bits(want))
    assert diff.size == 0, f"{what}: {diff.size} bytes differ, first at byte {diff[0]}"


def planes_of(c: Arrays, name: str) -> NVFP4Planes:
    parts = tuple(int(b) for b in c["partitions"]) if "partitions" in c else None
    return NVFP4Planes(c["codes"], c["scales"], c["global_scale"], partitions=parts, name=name)


# ------------------------------------------------------------- 1. regeneration, 2. sha256
def test_regenerated_fixtures_are_byte_identical(tmp_path: Path) -> None:
    regenerated = generate(tmp_path)
    committed_names = sorted(p.name for p in data_files().iterdir() if p.is_file())
    generated_names = sorted(p.name for p in tmp_path.iterdir())
    assert generated_names == committed_names
    for name in generated_names:
        assert (tmp_path / name).read_bytes() == committed(name), f"{name} differs"
    assert regenerated == manifest()
    assert [c["name"] for c in regenerated["cases"]] == NAMES


def test_regeneration_is_deterministic(tmp_path: Path) -> None:
    a = generate(tmp_path / "a")
    b = generate(tmp_path / "b")
    assert a == b
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (
        tmp_path / "b" / "manifest.json"
    ).read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_committed_sha256_matches(name: str) -> None:
    entry = BY_NAME[name]
    data = committed(entry["file"])
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert len(data) == entry["bytes"]
    assert fixtures.read_bytes(name) == data


def test_fixture_folder_is_small_and_complete() -> None:
    files = [p for p in data_files().iterdir() if p.is_file()]
    total = sum(len(p.read_bytes()) for p in files)
    assert total < 512 * 1024, f"fixtures take {total} bytes"
    assert sorted(p.name for p in files) == sorted([c["file"] for c in CASES] + ["manifest.json"])
    m = manifest()
    assert m["spec_version"] == SPEC_VERSION
    assert json.loads(committed("manifest.json")) == m


def test_cases_cover_the_issue() -> None:
    tags = {t for c in CASES for t in c["exercises"]}
    wanted = {
        "e2m1_ties", "e2m1_ulp_neighbours", "zero_blocks", "all_zero_tensor", "signed_zero",
        "tiny_negative", "subnormal_scales", "scale_clamp_min", "scale_clamp_max",
        "huge_outliers", "per_expert_globals", "gather_qmm", "out_of_range_experts",
        "fused_partitions", "per_partition_globals", "shared_global", "odd_n", "k16", "gguf",
        "mlx", "swizzle_padding", "compressed_tensors", "encode_global", "qmm", "w4a4",
        "static_input_scale", "dynamic_global", "nan_row",
    }  # fmt: skip
    assert wanted <= tags, wanted - tags
    shapes = {tuple(c["shape"]) for c in CASES if len(c["shape"]) >= 2}
    assert any(s[-2] == 7 for s in shapes)
    assert any(s[-2] == 33 for s in shapes)
    assert any(s[-1] == 16 for s in shapes)
    qmm_m = {k for c in CASES for k in c["arrays"] if k.startswith("qmm_y_m")}
    assert {"qmm_y_m1", "qmm_y_m3", "qmm_y_m33"} <= qmm_m


@pytest.mark.parametrize("name", NAMES)
def test_manifest_describes_every_array(name: str) -> None:
    entry = BY_NAME[name]
    c = load_case(name)
    assert entry["spec_version"] == SPEC_VERSION
    assert entry["file"] == f"{name}.safetensors"
    assert entry["description"]
    assert set(c) == set(entry["arrays"])
    allowed = {np.dtype(d).name for d in STORED_DTYPES}
    for key, role in entry["arrays"].items():
        a = c[key]
        assert a.dtype.name == role["stored_dtype"], key
        assert list(a.shape) == role["shape"], key
        assert a.dtype.name in allowed, key
        assert role["role"] in ("input", "expected")
        if role["role"] == "expected":
            assert role["rule"] in ("exact", "tolerance")
            for arg in role.get("args", {}).values():
                assert arg is None or arg == "." or arg in c, (key, arg)
        if role["rule" if role["role"] == "expected" else "role"] == "tolerance":
            assert role["dtype"] == "float32"
            assert role["path"] in ("qmm", "gather_qmm", "w4a4", "w4a8", "w4a8_fp8")
    if "input" in c:
        assert list(c["input"].shape) == entry["shape"]


def test_w4a8_cases_cover_the_issue() -> None:
    """Spec 1.1's W4A8 cases: the int8 rule's ties, zero blocks, NaN/Inf rows, ragged N,
    K = 32 and a larger K, unsorted and out-of-range expert ids; FP8 static and dynamic."""
    tags = {t for c in CASES for t in c["exercises"]}
    wanted = {
        "w4a8", "w4a8_fp8", "quantize_activations_q8", "q8_ties", "q8_ulp_neighbours",
        "q8_id_product", "q8_d_float16_ties", "q8_d_overflow", "q8_d_subnormal", "zero_blocks",
        "nan_row", "inf_row", "zero_row", "k32", "large_k", "odd_n", "qmm_w4a8",
        "gather_qmm_w4a8", "out_of_range_experts", "unsorted_experts", "qmm_w4a8_fp8",
        "quantize_activations_fp8", "e4m3_ties", "e4m3_subnormals", "fp8_saturation",
        "static_input_scale", "dynamic_input_scale", "global_amax_over_448",
    }  # fmt: skip
    assert wanted <= tags, wanted - tags
    w4a8 = [c for c in CASES if c["min_spec"] == "1.1"]
    ks = {c["shape"][-1] for c in w4a8 if c["shape"]}
    assert 32 in ks
    assert max(ks) >= 512
    ids = load_case("w4a8_gather")["expert_ids"]
    assert not np.all(np.diff(ids) >= 0)
    assert ((ids < 0) | (ids >= 3)).sum() >= 3


@pytest.mark.parametrize("name", NAMES)
def test_min_spec_is_the_newest_version_of_its_ops(name: str) -> None:
    """A case's ``min_spec`` is the spec version that defines its ops: 1.0's cases stay 1.0
    (a 1.0 certification runs them), W4A8's are 1.1 (a 1.0 certification skips them)."""
    entry = BY_NAME[name]
    ops = {r["op"] for r in entry["arrays"].values() if r["role"] == "expected"}
    want = max(["1.0", *(OP_MIN_SPEC[o] for o in ops if o in OP_MIN_SPEC)], key=version_key)
    assert entry["min_spec"] == want
    assert (want == "1.1") == name.startswith("w4a8"), name


def test_load_case_api() -> None:
    c = load_case("e2m1_ties")
    c["codes"][0, 0] = 0  # fresh writable copies
    assert load_case("e2m1_ties")["codes"][0, 0] != 0
    with pytest.raises(KeyError, match="e2m1_ties"):
        load_case("no_such_case")
    assert list_cases() == manifest()["cases"]
    assert list_cases() is not manifest()["cases"]


def test_tampered_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for p in data_files().iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    target = tmp_path / BY_NAME["k16"]["file"]
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0x01
    target.write_bytes(bytes(raw))
    monkeypatch.setattr(fixtures, "data_files", lambda: tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        load_case("k16")
    load_case("e2m1_ties")  # the others still load


# ------------------------------------------------------------------ 3. semantic checks
def _quantize_args(c: Arrays) -> tuple[Any, tuple[int, ...] | None]:
    g = c.get("global_scale_in")
    parts = tuple(int(b) for b in c["partitions"]) if "partitions" in c else None
    return g, parts


@pytest.mark.parametrize("name", WEIGHT_CASES)
def test_reference_quantize_reproduces_planes(name: str) -> None:
    c = load_case(name)
    g, parts = _quantize_args(c)
    p = reference.quantize(c["input"], g, partitions=parts, name=name)
    for plane in ("codes", "scales", "global_scale"):
        assert_bytes_equal(getattr(p, plane), c[plane], f"{name}.{plane}")
    assert p.partitions == parts


def _row_global_oracle(c: Arrays) -> npt.NDArray[np.float32]:
    """The decode global of every row, [E?, N], computed here (amax / 2688 in float32,
    1.0 where that is 0) or taken from the explicit global."""
    x = c["input"]
    n = x.shape[-2]
    parts = [int(b) for b in c["partitions"]] if "partitions" in c else [0, n]
    sizes = np.diff(parts)
    if "global_scale_in" in c:
        g = c["global_scale_in"].astype(F32)
        if g.ndim == 0:
            return np.full(x.shape[:-1], g, dtype=F32)
        if "partitions" in c:  # (P,) or (E, P): each partition's rows
            return np.repeat(g, sizes, axis=-1).astype(F32)
        return np.broadcast_to(g[:, None], x.shape[:-1]).astype(F32)  # (E,) per expert
    row_amax = np.abs(x).max(axis=-1)  # [E?, N]
    amax = np.stack(
        [row_amax[..., a:b].max(axis=-1) for a, b in itertools.pairwise(parts)], axis=-1
    )  # [E?, P]
    q = (amax / F32(GLOBAL_AMAX_DIVISOR)).astype(F32)
    g = np.where(q == 0, F32(1.0), q).astype(F32)
    return np.repeat(g, sizes, axis=-1).astype(F32)


def _unpack(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    return np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)


@pytest.mark.parametrize("name", WEIGHT_CASES)
def test_independent_encoder_agrees(name: str) -> None:
    """Spec 1.0's encoder written again with ml_dtypes casts (nearest-even) as the rounding
    oracle: global, scale bytes and codes all agree with the committed planes."""
    c = load_case(name)
    x = c["input"]
    row_g = _row_global_oracle(c)[..., None]  # [E?, N, 1]
    stored_row_g = expand_row_global(
        c["global_scale"],
        tuple(int(b) for b in c["partitions"]) if "partitions" in c else None,
        x.shape[0] if x.ndim == 3 else None,
        x.shape[-2],
    )[..., None]
    assert_bytes_equal(stored_row_g, row_g, f"{name} global per row")

    blocks = x.reshape(*x.shape[:-1], -1, 16)
    amax = np.abs(blocks).max(axis=-1)
    s = (amax / (F32(6.0) * row_g).astype(F32)).astype(F32)
    s = np.where(s == 0, F32(1.0), s)
    s = np.clip(s, F32(2.0**-9), F32(448.0)).astype(F32)
    scale_bytes = s.astype(F8).view(np.uint8)
    assert_bytes_equal(c["scales"], scale_bytes, f"{name} scale bytes")

    denom = (scale_bytes.view(F8).astype(F32) * row_g).astype(F32)[..., None]
    q = (blocks / denom).astype(F32)
    mag = np.minimum(np.abs(q), F32(6.0)).astype(F4).view(np.uint8) & 0x7
    codes = (mag | ((blocks < 0).astype(np.uint8) << 3)).reshape(x.shape)
    assert_bytes_equal(_unpack(c["codes"]), codes, f"{name} codes")


def test_e2m1_ties_by_hand() -> None:
    """The tie case's codes, written out from the E2M1 rounding rule (ties to even)."""
    c = load_case("e2m1_ties")
    # block A: 6, the ties 0.25 .. 5 (-> 0, 1, 1, 2, 2, 4, 4), their negatives, 0
    a = [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 0]
    # block B: 6, each tie one ulp below (rounds down), one ulp above (rounds up), -0.0 -> 0
    b = [7, 0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 7, 0]
    # block C: negated B with -6 as amax and a tiny negative (rounds to -0: code 8)
    cc = [15, 8, 9, 10, 11, 12, 13, 14, 9, 10, 11, 12, 13, 14, 15, 8]
    # block D: -6, +above, -below, +tiny
    d = [15, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0]
    row = np.array(a + b + cc + d, dtype=np.uint8)
    codes = _unpack(c["codes"])
    for r, scale in enumerate([2.0**-6, 0.25, 1.0, 1.5, 3.5, 448.0]):
        assert c["scales"][r].view(F8).astype(F32).tolist() == [scale] * 4
        if scale in (1.5, 3.5):  # ulp neighbours of a non-power-of-two scale may round
            np.testing.assert_array_equal(codes[r][:16], row[:16])  # onto the tie itself
        else:
            np.testing.assert_array_equal(codes[r], row)
    assert c["global_scale"] == F32(2.0**-8)


@pytest.mark.parametrize("name", WEIGHT_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dequantize_matches(name: str, dtype: str) -> None:
    c = load_case(name)
    p = planes_of(c, name)
    with np.errstate(over="ignore"):
        ours = reference.dequantize(p, dtype)
    assert_bytes_equal(ours, c[f"dequant_{dtype}"], f"{name} dequantize {dtype}")
    # ml_dtypes oracle: e2m1 * e4m3 (exact) times the row global, one float32 rounding
    values = _unpack(c["codes"]).view(F4).astype(F32).reshape(*c["scales"].shape, 16)
    values = values * c["scales"].view(F8).astype(F32)[..., None]
    row_g = p.row_global()[..., None, None]
    oracle = (values * row_g).astype(F32).reshape(p.shape)
    if dtype != "float32":
        with np.errstate(over="ignore"):
            oracle = oracle.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    assert_bytes_equal(oracle, c[f"dequant_{dtype}"], f"{name} ml_dtypes decode {dtype}")


@pytest.mark.parametrize("name", WEIGHT_CASES)
def test_layouts_reproduce_bytes(name: str) -> None:
    entry = BY_NAME[name]
    c = load_case(name)
    p = planes_of(c, name)
    if "gguf_data" in c:
        data, scale = to_gguf(p)
        assert_bytes_equal(data, c["gguf_data"], f"{name} gguf data")
        assert_bytes_equal(scale, c["gguf_scale"], f"{name} gguf scale")
        back = from_gguf(c["gguf_data"], c["gguf_scale"], name=name, k=p.k)
        assert_bytes_equal(back.codes, c["codes"], f"{name} from_gguf codes")
        assert_bytes_equal(back.scales, c["scales"], f"{name} from_gguf scales")
    mp = to_mlx(p)
    assert mp.weight.dtype == np.dtype("<u4")
    assert_bytes_equal(mp.weight, c["mlx_weight"], f"{name} mlx weight")
    mlx_back = from_mlx(MLXPlanes(c["mlx_weight"], c["scales"], c["global_scale"], p.partitions))
    assert_bytes_equal(mlx_back.codes, c["codes"], f"{name} from_mlx codes")
    if "mlx_global_scale_arg" in c:
        arg = mlx_global_scale_arg(p.global_scale)
        assert_bytes_equal(arg, c["mlx_global_scale_arg"], f"{name} mlx global arg")
    sw = swizzle_scales(p.scales)
    assert_bytes_equal(sw, c["swizzled_scales"], f"{name} swizzled scales")
    kb = p.scales.shape[-1]
    unsw = unswizzle_scales(c["swizzled_scales"], p.n, kb)
    assert_bytes_equal(unsw, c["scales"], f"{name} unswizzled scales")
    if "ct_weight_packed" in c:
        ct = to_compressed_tensors(p)
        assert_bytes_equal(ct["weight_packed"], c["ct_weight_packed"], f"{name} ct packed")
        assert_bytes_equal(ct["weight_scale"].view(np.uint8), c["ct_weight_scale"], f"{name} ct")
        g_enc = ct["weight_global_scale"]
        assert_bytes_equal(g_enc, c["ct_weight_global_scale"], f"{name} ct global")
        want = (1.0 / c["global_scale"].astype(np.float64)).astype(F32)
        np.testing.assert_array_equal(g_enc, np.broadcast_to(want, g_enc.shape))
        back_ct = from_compressed_tensors(
            {
                "weight_packed": c["ct_weight_packed"],
                "weight_scale": c["ct_weight_scale"].view(F8),
                "weight_global_scale": c["ct_weight_global_scale"],
            },
            name=name,
        )
        assert_bytes_equal(back_ct.codes, c["codes"], f"{name} from_ct codes")
        ulps = np.abs(
            back_ct.global_scale.view(np.int32).astype(np.int64)
            - np.broadcast_to(c["global_scale"], back_ct.global_scale.shape)
            .view(np.int32)
            .astype(np.int64)
        )
        assert ulps.max() <= 1
    for op in entry["refusals"]:
        with pytest.raises(PlaneError):
            LAYOUT_FUNCS[op](p)
    assert ("gguf_data" in c) == ("to_gguf" not in entry["refusals"])
    assert ("ct_weight_packed" in c) == ("to_compressed_tensors" not in entry["refusals"])


@pytest.mark.parametrize("name", WEIGHT_CASES)
def test_swizzle_bytes_follow_the_spec_formula(name: str) -> None:
    c = load_case(name)
    scales = c["scales"].reshape(-1, *c["scales"].shape[-2:])
    buf = c["swizzled_scales"].reshape(scales.shape[0], -1)
    n, kb = scales.shape[-2:]
    rows, cols = swizzled_scale_shape(n, kb)
    assert buf.shape[-1] == rows * cols
    nn, kk = np.meshgrid(np.arange(n), np.arange(kb), indexing="ij")
    off = swizzle_128x4_offset(nn, kk, kb)
    for e in range(scales.shape[0]):
        np.testing.assert_array_equal(buf[e][off], scales[e])
        pad = np.ones(buf.shape[-1], dtype=bool)
        pad[off.reshape(-1)] = False
        assert pad.sum() == rows * cols - n * kb
        assert not buf[e][pad].any(), "padding bytes must be zero"


@pytest.mark.parametrize("name", [n for n in WEIGHT_CASES if "gguf_data" in BY_NAME[n]["arrays"]])
def test_gguf_py_decodes_the_golden_bytes(name: str) -> None:
    gguf = pytest.importorskip("gguf")
    c = load_case(name)
    theirs = gguf.quants.dequantize(c["gguf_data"], gguf.GGMLQuantizationType.NVFP4)
    scale = c["gguf_scale"].reshape(-1, *([1] * (theirs.ndim - 1)))
    if "partitions" in c or c["gguf_scale"].shape == (1,):
        scale = c["gguf_scale"].reshape(())
    got = (theirs.astype(F32) * scale).astype(F32)
    want = c["dequant_float32"]
    assert got.shape == want.shape
    # gguf-py decodes code 8 (-0) as +0: compare values, then signs away from zero
    np.testing.assert_array_equal(got, want)
    nonzero = want != 0
    np.testing.assert_array_equal(np.signbit(got[nonzero]), np.signbit(want[nonzero]))


@pytest.mark.parametrize("name", WEIGHT_CASES)
def test_mlx_decodes_the_golden_words(name: str) -> None:
    mx = pytest.importorskip("mlx.core")
    c = load_case(name)
    words, scales = c["mlx_weight"], c["scales"]
    lead, n = words.shape[:-2], words.shape[-2]
    if words.shape[-1] % 4:  # K = 16: MLX's nvfp4 needs K % 32 == 0, so decode row pairs
        pad = n % 2
        words = np.concatenate([words, np.zeros((*lead, pad, 2), words.dtype)], axis=-2)
        scales = np.concatenate([scales, np.zeros((*lead, pad, 1), scales.dtype)], axis=-2)
        words = words.reshape(*lead, -1, 4)
        scales = scales.reshape(*lead, -1, 2)
    theirs = np.array(
        mx.dequantize(
            mx.array(words),
            mx.array(scales),
            group_size=16,
            bits=4,
            mode="nvfp4",
            dtype=mx.float32,
        )
    )
    theirs = theirs.reshape(*lead, -1, c["input"].shape[-1])[..., :n, :]
    row_g = planes_of(c, name).row_global()[..., None]
    got = (theirs * row_g).astype(F32)
    assert_bytes_equal(got, c["dequant_float32"], f"{name} mx.dequantize * global")


def test_fused_cases_equal_fuse_of_parts() -> None:
    for name, shared in (("fused_qkv_per_partition", False), ("fused_qkv_shared_global", True)):
        c = load_case(name)
        bounds = [int(b) for b in c["partitions"]]
        g = c["global_scale_in"][0] if shared else None
        parts = [
            reference.quantize(c["input"][a:b], g, name=f"{name}.{i}")
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
        fused = fuse(parts, name)
        stored = planes_of(c, name)
        for plane in ("codes", "scales", "global_scale"):
            assert_bytes_equal(getattr(fused, plane), c[plane], f"{name} fuse {plane}")
        assert fused.partitions == stored.partitions
        for got, want in zip(unfuse(stored), parts, strict=True):
            assert_bytes_equal(got.codes, want.codes, f"{name} unfuse")
            assert_bytes_equal(got.global_scale, want.global_scale, f"{name} unfuse global")
    per_part = load_case("fused_qkv_per_partition")["global_scale"]
    assert len(set(per_part.tolist())) == 3
    assert len(set(load_case("fused_qkv_shared_global")["global_scale"].tolist())) == 1


# -------------------------------------------------------------------------- matmuls
def _tolerance(path: str, dtype: str) -> float:
    from nvfp4.tolerances import tolerance

    return float(tolerance(path, dtype))


def _recompute(c: Arrays, name: str, role: dict[str, Any]) -> npt.NDArray[np.float64]:
    args = role["args"]
    p = planes_of(c, name)
    x = c[args["x"]]
    scale = c[args["input_scale"]] if args.get("input_scale") else None
    if role["op"] == "qmm":
        return np.asarray(reference.qmm(x, p, out_dtype=None))
    if role["op"] == "gather_qmm":
        return np.asarray(reference.gather_qmm(x, p, c[args["expert_ids"]], out_dtype=None))
    if role["op"] == "qmm_w4a8":
        return np.asarray(reference.qmm_w4a8(x, p, out_dtype=None))
    if role["op"] == "gather_qmm_w4a8":
        return np.asarray(reference.gather_qmm_w4a8(x, p, c[args["expert_ids"]], out_dtype=None))
    if role["op"] == "qmm_w4a8_fp8":
        return np.asarray(reference.qmm_w4a8_fp8(x, p, input_scale=scale, out_dtype=None))
    assert role["op"] == "qmm_w4a4"
    return np.asarray(reference.qmm_w4a4(x, p, input_scale=scale, out_dtype=None))


MATMULS = [
    (n, k)
    for n in NAMES
    for k, r in BY_NAME[n]["arrays"].items()
    if r["role"] == "expected" and r["rule"] == "tolerance"
]


@pytest.mark.parametrize(("name", "key"), MATMULS, ids=[f"{n}-{k}" for n, k in MATMULS])
def test_matmul_outputs_within_tolerance(name: str, key: str) -> None:
    c = load_case(name)
    role = BY_NAME[name]["arrays"][key]
    stored = c[key]
    ref = _recompute(c, name, role)
    assert stored.shape == ref.shape
    nan_rows = role.get("nan_rows", [])
    for r in nan_rows:
        assert np.isnan(stored[r]).all(), f"{name}.{key} row {r} should be NaN"
        assert np.isnan(ref[r]).all()
    finite = np.ones(stored.shape[0], dtype=bool)
    finite[nan_rows] = False
    assert np.isfinite(stored[finite]).all()
    for r in role.get("zero_rows", []):
        assert not stored[r].any(), f"{name}.{key} row {r} must be exactly zero"
        assert bits(stored[r]).max() == 0  # +0.0, not -0.0
    ref_f = ref[finite]
    scale = np.abs(ref_f).max()
    assert scale > 0, "a matmul fixture with an all-zero reference output checks nothing"
    assert_within(stored[finite], ref_f, _tolerance(role["path"], role["dtype"]), f"{name}.{key}")
    # the reference reproduces its own output exactly (its accumulation is exact here)
    assert_bytes_equal(ref.astype(F32), stored, f"{name}.{key}")


def test_activation_planes() -> None:
    c = load_case("w4a4_activations")
    for mode, scale in (("static", c["input_scale"]), ("dynamic", None)):
        a = reference.quantize_activations(c["act_x"], scale)
        for plane in ("codes", "scales", "global_scale"):
            assert_bytes_equal(getattr(a, plane), c[f"act_{mode}_{plane}"], f"act {mode} {plane}")
        assert (c[f"act_{mode}_scales"][2] == 0x7F).any()  # the NaN row's block
        assert (c[f"act_{mode}_scales"][[0, 1, 3]] != 0x7F).all()
    finite = np.nan_to_num(c["act_x"], nan=0.0)
    want = np.float32(np.abs(finite).max() / np.float32(GLOBAL_AMAX_DIVISOR))
    assert c["act_dynamic_global_scale"] == want
    assert c["act_static_global_scale"] == c["input_scale"]
    assert (c["act_static_scales"][[0, 1, 3]] == 0x7E).any()  # static: some blocks clamp
    assert (c["act_static_scales"][[0, 1, 3]] != 0x7E).any()


# ---------------------------------------------------------------- 4. W4A8 (spec 1.1)
def _activation_stems(op: str) -> list[tuple[str, str]]:
    """``(case, stem)`` of every activation encoding ``op`` the fixtures record (its arrays
    are ``<stem>_codes`` and the rest)."""
    return [
        (n, k.removesuffix("_codes"))
        for n in NAMES
        for k, r in BY_NAME[n]["arrays"].items()
        if r.get("op") == op and k.endswith("_codes")
    ]


@pytest.mark.parametrize(("name", "stem"), _activation_stems("quantize_activations_q8"))
def test_q8_planes_equal_gguf_py(name: str, stem: str) -> None:
    """The int8 codes and float16 ``d`` equal gguf-py's Q8_0 quantizer (ggml's reference
    rule), bit for bit, on every finite block; non-finite blocks have codes 0 and d NaN
    (pinned by the spec, undefined in ggml)."""
    gguf = pytest.importorskip("gguf")
    c = load_case(name)
    x, codes, d = c[f"{stem}_x"], c[f"{stem}_codes"], c[f"{stem}_d"].view(np.float16)
    m, k = x.shape
    assert codes.dtype == np.int8
    assert d.shape == (m, k // 32)
    blocks = x.reshape(m, k // 32, 32)
    finite = np.isfinite(blocks).all(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        q = gguf.quants.quantize(
            np.where(np.isfinite(x), x, 0).astype(F32), gguf.GGMLQuantizationType.Q8_0
        )
    q = q.reshape(m, k // 32, 34)
    their_d = q[..., :2].copy().view(np.float16)[..., 0]
    their_codes = q[..., 2:].copy().view(np.int8)
    assert_bytes_equal(d[finite], their_d[finite], f"{name}.{stem} d vs gguf-py")
    assert_bytes_equal(
        codes.reshape(m, k // 32, 32)[finite], their_codes[finite], f"{name}.{stem} vs gguf-py"
    )
    assert np.isnan(d[~finite]).all()
    assert not codes.reshape(m, k // 32, 32)[~finite].any()
    a = reference.quantize_activations_q8(x)
    assert_bytes_equal(a.codes, codes, f"{name}.{stem} reference codes")
    assert_bytes_equal(a.d, d, f"{name}.{stem} reference d")


def test_q8_rounding_case_by_hand() -> None:
    """The int8 tie case, written out: halves away from zero, ulp neighbours round to the
    nearer code, the float32 ``x * id`` products on midpoints round away, d's float16
    rounding (ties to even, subnormal, underflow, overflow)."""
    c = load_case("w4a8_q8_rounding")
    q, d = c["q8_codes"].astype(int), c["q8_d"].view(np.float16)
    # -0.5, -1.5, ..., -126.5 (block 0) and their float32 neighbours one ulp further from 0
    # (block 1) both round away from zero
    negative_halves = [-1, -2, -3, -4, -7, -64, -100, -127]
    assert q[0, :17].tolist() == [127, 1, 2, 3, 4, 7, 64, 100, 127, *negative_halves]
    assert q[0, 32:49].tolist() == [-127, 0, 1, 2, 3, 6, 63, 99, 126, *negative_halves]
    assert q[0, 64:71].tolist() == [127, 1, 3, 18, 51, 100, 127]
    inv = np.float32(1.0) / np.float32(np.float32(100.0) / np.float32(127.0))
    assert ((c["q8_x"][0, 65:71] * inv).astype(F32) == [0.5, 2.5, 17.5, 50.5, 99.5, 126.5]).all()
    assert d[0, :2].tolist() == [1.0, 0.125]
    assert d[1].tolist()[:3] == [1.0, 1.0 + 2.0**-9, 0.0]
    assert np.isinf(d[1, 3])
    assert d[2, :3].tolist() == [2.0**-20, 0.0, 0.0]
    assert np.isnan(d[3, :3]).all()
    assert np.isfinite(d[3, 3])
    assert not q[1, 64:96].any()
    assert not q[3, :96].any()


@pytest.mark.parametrize(("name", "stem"), _activation_stems("quantize_activations_fp8"))
def test_fp8_codes_equal_ml_dtypes(name: str, stem: str) -> None:
    """FP8 codes: ``float8_e4m3fn`` (nearest-even) of ``x / input_scale`` clamped to 448;
    0x7F for NaN/Inf; the dynamic scale is amax / 448 over the finite values."""
    c = load_case(name)
    args = BY_NAME[name]["arrays"][f"{stem}_codes"]["args"]
    x = c[args["x"]]
    finite = np.isfinite(x)
    if args["input_scale"] is None:
        amax = np.abs(x[finite]).max()
        s = np.float32(np.float32(amax) / np.float32(448.0))
    else:
        s = c[args["input_scale"]].astype(F32)
    assert_bytes_equal(c[f"{stem}_input_scale"], np.asarray(s, F32), f"{name}.{stem} scale")
    v = (np.where(finite, x, 0) / s).astype(F32)
    want = np.clip(v, -448.0, 448.0).astype(F32).astype(F8).view(np.uint8)
    want = np.where(finite, want, np.uint8(0x7F)).astype(np.uint8)
    assert_bytes_equal(c[f"{stem}_codes"], want, f"{name}.{stem} codes vs ml_dtypes")


def test_fp8_rounding_case_by_hand() -> None:
    c = load_case("w4a8_fp8_rounding")
    codes = c["fp8_static_codes"][0]
    got = codes[:9].view(F8).astype(F32).tolist()
    assert got == [1.0, 1.25, 16.0, 20.0, 256.0, 448.0, 0.0, 2.0**-8, 2.0**-8]
    assert codes[36:44].tolist() == [0x7E, 0x7E, 0x80, 0x80, 0x00, 0x7F, 0x7F, 0x7F]


def _ggml_w4a8(c: Arrays, name: str, stem: str) -> npt.NDArray[np.float64]:
    """ggml's W4A8 int8 dot product on the stored codes: per weight block j the integer
    ``isum_j = sum(2 * e2m1 * code)``, times ``e4m3 / 2`` and ``d`` (float64, exact), blocks
    summed, times the row's global."""
    p = planes_of(c, name)
    codes, d = c[f"{stem}_codes"].astype(np.int64), c[f"{stem}_d"].view(np.float16)
    w2 = (2 * _unpack(p.codes).view(F4).astype(np.float64)).astype(np.int64)  # [.., N, K]
    m, k = codes.shape
    xq = codes.reshape(m, 1, k // 16, 16)
    out = []
    for we, g in zip(
        w2.reshape(-1, *w2.shape[-2:]), p.row_global().reshape(-1, w2.shape[-2]), strict=True
    ):
        isum = (xq * we.reshape(1, we.shape[0], k // 16, 16)).sum(axis=-1)  # exact int
        assert np.abs(isum).max() <= 24384
        sc = p.scales.reshape(-1, *p.scales.shape[-2:])[len(out)]
        e4m3_half = sc.view(F8).astype(np.float64) / 2.0  # [N, K/16]
        dd = np.repeat(d.astype(np.float64), 2, axis=-1)[:, None, :]  # [M, 1, K/16]
        with np.errstate(invalid="ignore"):
            y = (isum * e4m3_half[None] * dd).sum(axis=-1) * g.astype(np.float64)[None]
        out.append(y)
    return np.stack(out)  # [E or 1, M, N]


@pytest.mark.parametrize("name", ["w4a8_qmm_k32_n7", "w4a8_qmm_n33_k512", "w4a8_gather"])
def test_w4a8_outputs_equal_ggml_integer_dot(name: str) -> None:
    c = load_case(name)
    entry = BY_NAME[name]["arrays"]
    (key,) = [k for k, r in entry.items() if r.get("path") == "w4a8"]
    stem = entry[key]["args"]["x"].removesuffix("_x")
    ys = _ggml_w4a8(c, name, stem)
    if "expert_ids" in c:
        ids = c["expert_ids"]
        ok = (ids >= 0) & (ids < ys.shape[0])
        want = np.zeros(ys.shape[1:])
        want[ok] = ys[ids[ok], np.flatnonzero(ok)]
    else:
        want = ys[0]
    stored = c[key]
    nan_rows = entry[key]["nan_rows"]
    assert np.isnan(want[nan_rows]).all()
    assert np.isnan(stored[nan_rows]).all()
    keep = np.ones(stored.shape[0], dtype=bool)
    keep[nan_rows] = False
    assert_bytes_equal(want[keep].astype(F32), stored[keep], f"{name} vs the ggml dot")


@pytest.mark.parametrize("name", ["w4a8_qmm_k32_n7", "w4a8_qmm_n33_k512", "w4a8_gather"])
def test_w4a8_matmul_inputs_clear_of_midpoints(name: str) -> None:
    """Every ``x * id`` of an int8 matmul input is at least ``Q8_MARGIN`` from a rounding
    midpoint, so the stored output is every conforming encoder's."""
    c = load_case(name)
    (xk,) = [k for k in c if k.endswith("_x")]
    x = np.where(np.isfinite(c[xk]), c[xk], 0).astype(F32)
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    d = (np.abs(blocks).max(axis=-1) / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, F32(0.0), F32(1.0) / d).astype(F32)
    v = np.abs((blocks * inv[..., None]).astype(F32)).astype(np.float64)
    assert (np.abs(v - np.floor(v) - 0.5) >= Q8_MARGIN).all()
