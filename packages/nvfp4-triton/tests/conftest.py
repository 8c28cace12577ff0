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
from nvfp4_triton.config import KernelConfig
from triton_helpers import AMD_LIKE, NVIDIA_LIKE

_REQUIRE = os.environ.get("NVFP4_REQUIRE_ORACLES") == "1"


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _REQUIRE:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        for report in skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            print(f"\nNVFP4_REQUIRE_ORACLES=1 forbids skips: {report.nodeid}: {reason}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
