"""Checks shared by the GPU-only engines' test modules (collected where the engine is
installed: a machine with an NVIDIA GPU, as in the engine's nox session)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from nvfp4 import reference


def quantizer_matches_the_reference(backend, rng) -> None:
    a = backend.availability()
    assert a.ok, a.reason
    x = rng.standard_normal((6, 128)).astype(np.float32).astype(ml_dtypes.bfloat16)
    got = backend.quantize_activations(x)
    ref = reference.quantize_activations(x, None)
    np.testing.assert_array_max_ulp(got.global_scale, ref.global_scale, maxulp=1)
    assert np.array_equal(got.scales, ref.scales)
