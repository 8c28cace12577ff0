"""Shared set-up for the nvfp4-rocm tests.

The kernels run under Triton's interpreter on the CPU (``TRITON_INTERPRET=1`` is set here,
before triton is imported), with the tiles of real AMD architectures: the ``amd`` fixture
gives a backend configured as gfx942 (CDNA3, 64-lane wavefronts) and as gfx1201 (RDNA4,
32-lane wavefronts), so every verb runs the shared kernels with both widths. What needs a
GPU (device detection) is tested against monkeypatched torch device queries. As in
nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` turns skips into failures.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
from nvfp4_rocm import ROCmBackend, backend
from nvfp4_rocm.device import ARCH_ENV

#: (architecture, its wavefront width): one CDNA and one RDNA configuration.
AMD_ARCHS = [("gfx942", 64), ("gfx1201", 32)]


@pytest.fixture(params=AMD_ARCHS, ids=["gfx942-lanes64", "gfx1201-lanes32"])
def amd(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ROCmBackend:
    """The rocm backend under the interpreter with a CDNA and an RDNA configuration."""
    arch, lanes = request.param
    monkeypatch.setenv(ARCH_ENV, arch)
    b = backend()
    cfg = b.platform().config
    assert cfg is not None
    assert (cfg.name, cfg.lanes) == (arch, lanes)
    return b
