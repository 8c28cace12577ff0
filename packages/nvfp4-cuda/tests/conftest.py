"""Shared set-up for the nvfp4-cuda tests.

The kernels run under Triton's interpreter on the CPU (``TRITON_INTERPRET=1`` is set here,
before triton is imported); what needs a GPU (device detection, W4A4's GEMM) is tested
against monkeypatched torch device queries and an emulation of ``torch._scaled_mm`` built
from the spec tables. As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` turns skips into failures.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
