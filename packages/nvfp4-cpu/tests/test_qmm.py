"""W4A16 qmm at every supported instruction-set level against nvfp4.reference.qmm."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import nvfp4
import pytest
from cpu_helpers import check_close, cpuinfo_field, heavy_tailed_weight
from nvfp4 import reference
from nvfp4_cpu import CPUBackend
from nvfp4_cpu._native import Native
from nvfp4_cpu.layout import prepare

M_VALUES = (1, 3, 33, 300)
N_VALUES = (1, 7, 33, 100)
K_VALUES = (16, 48, 4096)


@pytest.mark.parametrize(("m", "n", "k"), list(itertools.product(M_VALUES, N_VALUES, K_VALUES)))
def test_qmm_matches_reference(isa: str, m: int, n: int, k: int) -> None:
    p = heavy_tailed_weight(n, k)
    b = CPUBackend(isa=isa, threads=2)
    x = np.random.default_rng(m + n + k).standard_normal((m, k)).astype(np.float32)
    y = b.qmm(x, b.prepare(p))
    assert y.dtype == np.float32
    assert y.shape == (m, n)
    check_close("qmm", "float32", y, reference.qmm(x, p, out_dtype=None), f"{isa} {m}x{n}x{k}")


def test_qmm_per_partition_globals(isa: str) -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((45, 64)).astype(np.float32)
    w[:20] *= 100.0  # partitions with very different ranges, hence globals
    w[30:] *= 1e-3
    p = nvfp4.quantize(w, partitions=(0, 20, 30, 45), name="qkv")
    assert p.global_scale.shape == (3,)
    assert len(set(p.global_scale.tolist())) == 3
    b = CPUBackend(isa=isa)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    y = b.qmm(x, b.prepare(p))
    ref = reference.qmm(x, p, out_dtype=None)
    for a, c in ((0, 20), (20, 30), (30, 45)):  # each partition on its own scale
        check_close("qmm", "float32", y[:, a:c], ref[:, a:c], f"{isa} partition {a}:{c}")


def test_qmm_every_scale_byte_and_code(isa: str) -> None:
    """All 127 valid scale bytes (subnormals included) and all 256 code bytes."""
    k = 16 * 127
    rows = np.arange(18)[:, None]
    codes = ((np.arange(k // 2)[None, :] + 37 * rows) % 256).astype(np.uint8)  # every byte
    scales = ((np.arange(127)[None, :] + 5 * rows) % 127).astype(np.uint8)  # 0x00 .. 0x7E
    p = nvfp4.NVFP4Planes(codes, scales, np.float32(0.75), name="all-bytes")
    b = CPUBackend(isa=isa)
    x = np.random.default_rng(3).standard_normal((2, k)).astype(np.float32)
    check_close("qmm", "float32", b.qmm(x, b.prepare(p)), reference.qmm(x, p, out_dtype=None), isa)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_qmm_input_and_output_dtypes(isa: str, dtype: type) -> None:
    p = heavy_tailed_weight(33, 48)
    b = CPUBackend(isa=isa)
    x = np.random.default_rng(5).standard_normal((3, 48)).astype(dtype)
    y = b.qmm(x, b.prepare(p))
    ref = reference.qmm(x, p, out_dtype=dtype)  # the reference backend's rule: x's dtype
    assert y.dtype == np.dtype(dtype)
    name = {np.float16: "float16", ml_dtypes.bfloat16: "bfloat16", np.float64: "float32"}[dtype]
    check_close("qmm", name, y, ref, f"{isa} x {np.dtype(dtype)}")
    # an explicit out_dtype wins over x's dtype
    y32 = b.qmm(x, b.prepare(p), out_dtype="float32")
    assert y32.dtype == np.float32
    check_close("qmm", "float32", y32, reference.qmm(x, p, out_dtype=None), isa)


def test_qmm_leading_axes_and_vector(isa: str) -> None:
    p = heavy_tailed_weight(7, 48)
    b = CPUBackend(isa=isa)
    pw = b.prepare(p)
    x = np.random.default_rng(9).standard_normal((2, 3, 48)).astype(np.float32)
    y = b.qmm(x, pw)
    assert y.shape == (2, 3, 7)
    check_close("qmm", "float32", y, reference.qmm(x, p, out_dtype=None), isa)
    v = b.qmm(x[0, 0], pw)
    assert v.shape == (7,)
    check_close("qmm", "float32", v, reference.qmm(x[0, 0], p, out_dtype=None), isa)
    assert b.qmm(np.zeros((0, 48), np.float32), pw).shape == (0, 7)


def test_qmm_raw_planes_are_accepted(isa: str) -> None:
    p = heavy_tailed_weight(33, 48)
    b = CPUBackend(isa=isa)
    x = np.ones((2, 48), np.float32)
    np.testing.assert_array_equal(b.qmm(x, p), b.qmm(x, b.prepare(p)))


@pytest.mark.parametrize("m", [1, 2, 5, 33])
def test_qmm_thread_counts_give_identical_bits(isa: str, m: int) -> None:
    p = heavy_tailed_weight(100, 4096)
    x = np.random.default_rng(m).standard_normal((m, 4096)).astype(np.float32)
    results = [CPUBackend(isa=isa, threads=t).qmm(x, p) for t in (1, 2, 3)]
    for r in results[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), results[0].view(np.uint32))


def test_qmm_nonfinite_activations_propagate(isa: str) -> None:
    p = heavy_tailed_weight(7, 48)
    x = np.ones((3, 48), np.float32)
    x[1, 5] = np.nan
    x[2, 40] = np.inf
    y = CPUBackend(isa=isa).qmm(x, p)
    ref = reference.qmm(x, p, out_dtype=None)
    np.testing.assert_array_equal(np.isfinite(y), np.isfinite(ref))
    assert np.isfinite(y[0]).all()
    assert not np.isfinite(y[1]).any()


def test_qmm_refusals(native: Native) -> None:
    b = CPUBackend()
    pw = b.prepare(heavy_tailed_weight(7, 48))
    with pytest.raises(
        ValueError, match=r"x must be \[\.\.\., K\] with K = 48, found shape \(2, 32\)"
    ):
        b.qmm(np.ones((2, 32), np.float32), pw)
    with pytest.raises(ValueError, match="expected a float32, float16, bfloat16 or float64"):
        b.qmm(np.ones((2, 48), np.int32), pw)
    with pytest.raises(ValueError, match="output dtype"):
        b.qmm(np.ones((2, 48), np.float32), pw, out_dtype="int8")
    moe = b.prepare(nvfp4.quantize(np.ones((2, 7, 48), np.float32)))
    with pytest.raises(ValueError, match="go through gather_qmm"):
        b.qmm(np.ones((2, 48), np.float32), moe)


def test_qmm_into_preallocated_output(isa: str, native: Native) -> None:
    from nvfp4_cpu import ops

    p = heavy_tailed_weight(33, 48)
    pw = prepare(p, native)
    x = np.random.default_rng(11).standard_normal((3, 48)).astype(np.float32)
    out = np.full((3, 33), np.nan, np.float32)
    assert ops.qmm(native, isa, 2, x, pw, out=out) is out
    check_close("qmm", "float32", out, reference.qmm(x, p, out_dtype=None), isa)
    with pytest.raises(ValueError, match="out must be C-contiguous float32"):
        ops.qmm(native, isa, 2, x, pw, out=np.empty((3, 32), np.float32))
    with pytest.raises(ValueError, match="out= needs out_dtype float32"):
        ops.qmm(native, isa, 2, x, pw, out=out, out_dtype="float16")


def test_qmm_every_chunk_kernel(isa: str) -> None:
    """M = 1 .. 34 reaches every specialised kernel (one per chunk size, up to 24 rows at
    AVX-512, 32 at AVX2) and the split of M into balanced chunks past each level's largest."""
    p = heavy_tailed_weight(33, 48)
    b = CPUBackend(isa=isa, threads=2)
    pw = b.prepare(p)
    rng = np.random.default_rng(21)
    for m in range(1, 35):
        x = rng.standard_normal((m, 48)).astype(np.float32)
        check_close(
            "qmm", "float32", b.qmm(x, pw), reference.qmm(x, p, out_dtype=None), f"{isa} M={m}"
        )


def test_avx2_one_row_decodes_give_the_same_bits(native: Native) -> None:
    """The AVX2 level's two M = 1 decodes (float16 patterns through vcvtph2ps, bfloat16
    pairs) sum the same exact products in the same order: equal bits on every shape, every
    scale byte and code, non-finite x and any thread count, both within the spec tolerance;
    the CPU's default is float16 on Intel and bfloat16 pairs elsewhere."""
    with pytest.raises(ValueError, match="mode must be one of"):
        native.avx2_m1_decode("float32")
    if not native.supported("avx2"):
        # No AVX2 level (another architecture, or an x86 CPU without AVX2 / FMA / F16C):
        # the switch reports no decode and setting one changes nothing.
        for mode in (None, "float16", "bfloat16 pairs", "default"):
            assert native.avx2_m1_decode(mode) == ""
        assert "avx2" not in native.supported_levels()
        return
    default = native.avx2_m1_decode()
    vendor = cpuinfo_field("vendor_id")  # "GenuineIntel", "AuthenticAMD", ...
    if vendor:
        assert default == ("float16" if vendor == "GenuineIntel" else "bfloat16 pairs"), vendor
    k_all = 16 * 127
    rows = np.arange(18)[:, None]
    every_byte = nvfp4.NVFP4Planes(
        ((np.arange(k_all // 2)[None, :] + 37 * rows) % 256).astype(np.uint8),
        ((np.arange(127)[None, :] + 5 * rows) % 127).astype(np.uint8),
        np.float32(0.75),
        name="all-bytes",
    )
    weights = [heavy_tailed_weight(n, k) for n, k in ((1, 16), (7, 48), (33, 4096), (100, 64))]
    weights.append(every_byte)
    backends = [CPUBackend(isa="avx2", threads=t) for t in (1, 2)]
    try:
        for p in weights:
            pws = [b.prepare(p) for b in backends]
            x = np.random.default_rng(p.k).standard_normal((1, p.k)).astype(np.float32)
            xs = [x, x.copy()]
            xs[1][0, p.k // 3] = np.inf
            for xi in xs:
                got = {}
                for mode in ("float16", "bfloat16 pairs"):
                    assert native.avx2_m1_decode(mode) == mode
                    got[mode] = [b.qmm(xi, pw) for b, pw in zip(backends, pws, strict=True)]
                want = got["bfloat16 pairs"][0]
                for y in got["float16"] + got["bfloat16 pairs"][1:]:
                    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
                if np.isfinite(xi).all():
                    ref = reference.qmm(xi, p, out_dtype=None)
                    check_close("qmm", "float32", want, ref, f"avx2 M=1 {p.n}x{p.k}")
    finally:
        assert native.avx2_m1_decode("default") == default
