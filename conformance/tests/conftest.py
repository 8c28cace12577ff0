"""Self-tests of the conformance suite.

The suite is run in-process with ``pytester`` against test-only backends (see
``broken_backends.py``), registered exactly like real ones: a ``*.dist-info`` directory
with an ``entry_points.txt`` in the group ``nvfp4.backends``, put on ``sys.path``.

Tests that need the ``parity`` extra or the SmolLM2 wheel import them with
``pytest.importorskip``; with ``NVFP4_REQUIRE_ORACLES=1`` (CI) any skip fails the run.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

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
