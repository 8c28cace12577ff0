"""Shared set-up for the nvfp4-triton tests.

Every kernel runs under Triton's interpreter on the CPU: ``TRITON_INTERPRET=1`` is set here,
before anything imports triton (the ``@triton.jit`` decorator reads it at import time).

Two configs run the same kernels: ``cfg`` (NVIDIA-flavoured, 32-lane warps) and ``amd_cfg``
(64-lane wavefronts, ``num_warps`` sized for them). Their tiles are small, so a test shape
spans several programs in every direction and the masks at ragged edges are exercised, yet
each case stays within a few dozen program-iterations.

As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` (set by CI) turns any skip into a failure.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
from nvfp4_triton.config import KernelConfig
from triton_helpers import AMD_LIKE, NVIDIA_LIKE


@pytest.fixture(params=[NVIDIA_LIKE, AMD_LIKE], ids=["lanes32", "lanes64"])
def any_cfg(request: pytest.FixtureRequest) -> KernelConfig:
    """Both configs: a test using it proves the kernels are warp-width agnostic."""
    cfg: KernelConfig = request.param
    return cfg


@pytest.fixture
def cfg() -> KernelConfig:
    return NVIDIA_LIKE


@pytest.fixture
def amd_cfg() -> KernelConfig:
    return AMD_LIKE
