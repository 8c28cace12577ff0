"""The AArch64 NEON level: bit-identical to the portable level, forced by NVFP4_CPU_ISA=neon,
reported as "aarch64 NEON (+dotprod)", refused clearly where it is not built.

On an x86-64 machine these tests check the refusals (NEON is not built there); on AArch64,
natively or under qemu-user (``scripts/aarch64_emulated.sh``), they compare NEON with the
portable level byte for byte on cases chosen for its code paths: every chunk size 1..8 and
more, ragged N (a half-empty tile, a tile whose second half is padding), every code and
valid scale byte, non-finite and subnormal activations, experts with idle ones, and every
dequantize output kind. conftest.py also repeats every NEON kernel call of the other test
files at the portable level.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import nvfp4
import pytest
from cpu_helpers import BIT_IDENTICAL_TO_PORTABLE, CROSS_CHECKED
from nvfp4.spec import E2M1_BOUNDS, E2M1_ODD_BOUNDS, E2M1_VALUES, E4M3_VALUES, ENCODER_CONSTANTS
from nvfp4_cpu import CPUBackend, IsaUnavailable, ops
from nvfp4_cpu._native import ISA_LEVELS, Native, ptr, resolve_isa
from nvfp4_cpu.layout import prepare

AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def _exact_levels(native: Native) -> list[str]:
    return [i for i in BIT_IDENTICAL_TO_PORTABLE if native.supported(i)]


def _same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.dtype == b.dtype, what
    assert a.shape == b.shape, what
    view = {4: np.uint32, 2: np.uint16}[a.dtype.itemsize]
    bad = np.flatnonzero(a.view(view).reshape(-1) != b.view(view).reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} elements differ, first at {bad[0]}"


def _planes(rng: np.random.Generator, shape: tuple[int, ...]) -> nvfp4.NVFP4Planes:
    """Random codes (every byte) and valid scale bytes (0x00..0x7E, subnormals included)."""
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 127, size=(*lead, n, k // 16), dtype=np.uint8)
    g = rng.uniform(0.01, 4.0, size=tuple(lead)).astype(np.float32)
    return nvfp4.NVFP4Planes(codes, scales, g if lead else np.float32(0.37), name="random")


def _activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x *= np.exp2(rng.integers(-30, 30, size=(m, k))).astype(np.float32)
    if m > 2:
        x[1, 0] = np.inf
        x[2, -1] = np.nan
        x[0, 3] = np.float32(1e-42)  # subnormal
        x[0, 4] = -0.0
    return x


def test_neon_levels_match_portable_bit_for_bit(native: Native) -> None:
    """qmm, gather_qmm and dequantize of each bit-identical level against portable."""
    rng = np.random.default_rng(2024)
    for isa in _exact_levels(native):
        for n, k in ((1, 16), (8, 32), (15, 48), (16, 16), (17, 160), (40, 64)):
            w = prepare(_planes(rng, (n, k)), native)
            for m in (*range(1, 11), 17, 25):
                x = _activations(rng, m, k)
                want = ops.qmm(native, "portable", 1, x, w)
                for threads in (1, 2):
                    got = ops.qmm(native, isa, threads, x, w)
                    _same_bits(got, want, f"{isa} qmm M={m} N={n} K={k} threads={threads}")
            for dtype in ("float32", "float16", "bfloat16"):
                _same_bits(
                    ops.dequantize(native, isa, 2, w, dtype),
                    ops.dequantize(native, "portable", 2, w, dtype),
                    f"{isa} dequantize N={n} K={k} {dtype}",
                )
        we = prepare(_planes(rng, (5, 23, 64)), native)
        for m in (1, 4, 9, 30):
            x = _activations(rng, m, 64)
            ids = rng.integers(-1, 6, size=m)  # expert 4 idle in some, -1 and 5 out of range
            _same_bits(
                ops.gather_qmm(native, isa, 2, x, we, ids),
                ops.gather_qmm(native, "portable", 2, x, we, ids),
                f"{isa} gather_qmm M={m}",
            )


def test_every_neon_call_is_checked_against_portable(native: Native) -> None:
    """The conftest wrapper is active: a NEON call counts one more comparison."""
    for isa in _exact_levels(native):
        before = CROSS_CHECKED[f"{isa}/qmm"]
        p = nvfp4.quantize(np.random.default_rng(1).standard_normal((20, 32)).astype(np.float32))
        CPUBackend(isa=isa).qmm(np.ones((3, 32), np.float32), p)
        assert CROSS_CHECKED[f"{isa}/qmm"] == before + 1


def test_isa_env_forces_neon(native: Native, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_CPU_ISA", "neon")
    if native.supported("neon"):
        assert resolve_isa(native) == "neon"
        a = CPUBackend(threads=2).availability()
        assert a.ok, a.reason
        dotprod = " (+dotprod)" if native.has("asimddp") else ""
        # the ISA and threads, then the cache plan (its figures are test_plan.py's)
        assert a.device.startswith(f"aarch64 NEON{dotprod}, 2 threads; plan: L1d "), a.device
        assert native.best_isa() == "neon"  # the default on AArch64 too
    else:
        assert not AARCH64 or not native.has("asimd")
        with pytest.raises(IsaUnavailable, match=r"'neon'"):
            resolve_isa(native)
        a = CPUBackend().availability()
        assert not a.ok
        assert "neon" in a.reason


def test_neon_needs_the_spec_tables_its_decoder_holds(native: Native) -> None:
    """The dispatcher offers NEON only while every E2M1 value fits its byte table (the
    high byte of a float16); an E2M1 table it cannot hold takes the level away, and the real
    tables bring it back."""
    e2m1_max, e4m3_max, min_sub, bias, nan_byte = ENCODER_CONSTANTS
    neon = ISA_LEVELS.index("neon")
    had = bool(native.lib.nvfp4cpu_isa_supported(neon))
    assert had == (AARCH64 and native.has("asimd"))

    def init(e2m1: np.ndarray) -> None:
        tables = [
            np.ascontiguousarray(t, dtype=np.float32)
            for t in (e2m1, E4M3_VALUES, E2M1_BOUNDS, E2M1_ODD_BOUNDS)
        ]
        addrs = [ptr(t, ctypes.c_float) for t in tables]
        rc = native.lib.nvfp4cpu_init(*addrs, e2m1_max, e4m3_max, min_sub, int(bias), int(nan_byte))
        assert rc == 0

    odd = np.asarray(E2M1_VALUES, np.float32).copy()
    odd[3] = np.float32(1.1)  # needs 10 mantissa bits: not a "high byte" float16
    try:
        init(odd)
        assert not native.lib.nvfp4cpu_isa_supported(neon)
    finally:
        init(np.asarray(E2M1_VALUES, np.float32))
    assert bool(native.lib.nvfp4cpu_isa_supported(neon)) == had
