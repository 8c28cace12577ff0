"""The ``vllm`` adapter on a machine with an NVIDIA GPU: available, and its NVFP4 quantizer's
scale bytes are the reference's on normal bfloat16 data."""

from __future__ import annotations

from _gpu_checks import quantizer_matches_the_reference


def test_available_and_quantizer_matches_the_reference(backend, rng) -> None:
    quantizer_matches_the_reference(backend, rng)
