"""The ``gguf-py`` adapter: gguf.quants' NVFP4 decode, bit for bit against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import weight
from nvfp4 import PlaneError, reference
from nvfp4.fusion import fuse, stack_experts


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dequantize_matches_the_reference_bit_for_bit(backend, dtype: str) -> None:
    p = weight(24, 128, 0)
    got = backend.dequantize(p, dtype)
    ref = reference.dequantize(p, dtype)
    # +0 and -0 compare equal: a decoded 0 keeps no sign in gguf-py (kvalues[8] is 0)
    assert np.array_equal(got.astype(np.float32), ref.astype(np.float32))
    assert got.dtype == ref.dtype
    nonzero = ref.astype(np.float32) != 0
    assert np.array_equal(_bits(got)[nonzero], _bits(ref)[nonzero])


def test_experts_and_fused_partitions_keep_their_globals(backend) -> None:
    fused = fuse([weight(8, 64, 1, 0.01), weight(16, 64, 2, 100.0)], "gate_up")
    stack = stack_experts([weight(8, 64, 3), weight(8, 64, 4, 5.0)], "experts")
    for p in (fused, stack):
        assert np.array_equal(backend.dequantize(p), reference.dequantize(p))


def test_k_not_a_multiple_of_64_has_no_gguf_form(backend) -> None:
    with pytest.raises(PlaneError, match=r"'w8x32'.*multiple of 64.*K = 32"):
        backend.prepare(weight(8, 32, 5))


def test_what_gguf_py_lacks_is_absent(backend) -> None:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    with pytest.raises(NotImplementedError):  # the engine's own answer
        quantize(np.ones((1, 64), np.float32), GGMLQuantizationType.NVFP4)
    for verb in ("quantize_activations", "qmm", "gather_qmm", "qmm_w4a8"):
        assert not backend.has(verb)
    with pytest.raises(NotImplementedError, match=r"gguf-py.*no qmm kernel"):
        backend.qmm(np.ones((1, 64), np.float32), weight(4, 64, 6))
