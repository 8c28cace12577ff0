"""The committed golden fixtures (``nvfp4/fixtures/data``).

1. The generator reproduces every committed file and the manifest byte for byte.
2. Every committed file matches the sha256 in the manifest.
3. Every case is re-checked semantically: the reference encoder reproduces its planes; an
   independent encoder built on ``ml_dtypes`` (``float8_e4m3fn`` / ``float4_e2m1fn``
   casts, round-to-nearest-even) reproduces its global, scale bytes and codes; decoding
   matches the reference and ``ml_dtypes``; every layout reproduces its bytes (and
   gguf-py / MLX decode them to the same values); matmul outputs are within
   ``nvfp4.tolerances`` (and equal to the reference's float32 result).
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
from nvfp4 import fixtures, reference
from nvfp4.fixtures import data_files, list_cases, load_case, manifest
from nvfp4.fixtures.generate import STORED_DTYPES, generate
from nvfp4.fusion import fuse, unfuse
from nvfp4.layouts.compressed_tensors import from_compressed_tensors, to_compressed_tensors
from nvfp4.layouts.gguf import from_gguf, to_gguf
from nvfp4.layouts.mlx import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from nvfp4.layouts.swizzle import swizzle_scales, unswizzle_scales
from nvfp4.planes import NVFP4Planes, PlaneError, expand_row_global
from nvfp4.spec import GLOBAL_AMAX_DIVISOR, SPEC_VERSION, swizzle_128x4_offset, swizzled_scale_shape
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
    shapes = {tuple(c["shape"]) for c in CASES}
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
            assert role["path"] in ("qmm", "gather_qmm", "w4a4")
    if "input" in c:
        assert list(c["input"].shape) == entry["shape"]


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
