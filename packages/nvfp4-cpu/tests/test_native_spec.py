"""The compiled library takes the spec's facts from nvfp4.spec and owns its CPU feature bits.

``nvfp4cpu_init`` receives the E2M1 / E4M3 tables and the encoder's constants
(:data:`nvfp4.spec.ENCODER_CONSTANTS`); the CPU feature bits are the library's, read by name.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

import numpy as np
import pytest
from cpu_helpers import cpuinfo_flags
from nvfp4 import reference
from nvfp4.spec import E4M3_NAN_BYTE, ENCODER_CONSTANTS
from nvfp4_cpu._native import ABI_VERSION, ptr

X86 = platform.machine() in ("x86_64", "AMD64", "i386", "i686")
AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def test_abi_version(native: Any) -> None:
    assert native.lib.nvfp4cpu_abi_version() == ABI_VERSION == 6


def test_feature_bits_come_from_the_library(native: Any) -> None:
    assert native.has("x86") == X86
    assert native.has("aarch64") == AARCH64
    if not AARCH64:
        assert not native.has("asimd")
        assert not native.has("asimddp")
    if X86:
        flags = cpuinfo_flags()
        for feature in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"):
            assert native.has(feature) == (feature in flags), feature
    with pytest.raises(ValueError, match="no CPU feature 'sse9'"):
        native.has("sse9")


def test_init_refuses_bad_encoder_constants(native: Any) -> None:
    tables = [np.zeros(n, dtype=np.float32) for n in (16, 256, 7, 3)]
    addrs = [ptr(t, ctypes.c_float) for t in tables]
    e2m1_max, e4m3_max, min_sub, bias, _ = ENCODER_CONSTANTS
    for bad_nan in (0, 256):
        rc = native.lib.nvfp4cpu_init(*addrs, e2m1_max, e4m3_max, min_sub, bias, bad_nan)
        assert rc == -1
    rc = native.lib.nvfp4cpu_init(*addrs, 0.0, e4m3_max, min_sub, bias, E4M3_NAN_BYTE)
    assert rc == -1


def test_nonfinite_block_gets_the_spec_nan_byte() -> None:
    from nvfp4_cpu import CPUBackend

    b = CPUBackend()
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    x[1, 20] = np.inf
    x[2, 63] = np.nan
    got = b.quantize_activations(b.from_numpy(x), None)
    ref = reference.quantize_activations(x, None)
    assert got.scales[1, 1] == got.scales[2, 3] == E4M3_NAN_BYTE
    np.testing.assert_array_equal(got.scales, ref.scales)
    np.testing.assert_array_equal(got.codes, ref.codes)
