"""The ``transformer-engine`` adapter on a machine with an NVIDIA GPU: available, and its NVFP4 quantizer's
scale bytes are the reference's on normal bfloat16 data."""

from __future__ import annotations

import pytest
from _gpu_checks import quantizer_matches_the_reference
from nvfp4 import get_backend


@pytest.fixture(scope="module")
def backend():
    return get_backend("transformer-engine")


def test_available_and_quantizer_matches_the_reference(backend, rng) -> None:
    quantizer_matches_the_reference(backend, rng)
