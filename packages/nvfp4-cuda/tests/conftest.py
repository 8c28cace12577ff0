"""Shared set-up for the nvfp4-cuda tests.

The kernels run under Triton's interpreter on the CPU (``TRITON_INTERPRET=1`` is set here,
before triton is imported); what needs a GPU (device detection, W4A4's GEMM) is tested
against monkeypatched torch device queries and an emulation of ``torch._scaled_mm`` built
from the spec tables. As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` turns skips into failures.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest

_REQUIRE = os.environ.get("NVFP4_REQUIRE_ORACLES") == "1"


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
