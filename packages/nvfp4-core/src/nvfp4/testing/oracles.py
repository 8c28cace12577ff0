"""The pytest hooks of the oracle rule, shared by the test suites of the nvfp4 packages
(pytest itself is imported only by the suites that use them).

The oracle rule: tests import their cross-check libraries (nvidia-modelopt, gguf, mlx,
ml_dtypes, compressed-tensors, ...) with ``pytest.importorskip``, so a suite runs on a bare
machine. CI installs every oracle and sets ``NVFP4_REQUIRE_ORACLES=1``; then any skipped
test fails the session, so no cross-check passes by skipping. The one exception is a test
marked ``optional_oracle`` (an oracle its issue calls optional, such as llama-cpp-python):
its skip is reported, not fatal.

A suite's ``conftest.py`` takes the rule with::

    from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pytest

__all__ = ["OPTIONAL_ORACLE", "REQUIRE_ORACLES_ENV", "pytest_configure", "pytest_sessionfinish"]

#: The environment variable that turns skips into failures ("1").
REQUIRE_ORACLES_ENV: Final = "NVFP4_REQUIRE_ORACLES"
#: The marker of a test whose oracle is optional.
OPTIONAL_ORACLE: Final = "optional_oracle"


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``optional_oracle`` marker."""
    config.addinivalue_line(
        "markers", f"{OPTIONAL_ORACLE}: the test's oracle is optional; its skip is not fatal"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session for each skip (but those marked ``optional_oracle``) when
    ``NVFP4_REQUIRE_ORACLES=1``, naming every skipped test and its reason."""
    if os.environ.get(REQUIRE_ORACLES_ENV) != "1":
        return
    import pytest

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    # a module skipped while collected leaves a CollectReport, which has no keywords: its
    # skip counts (a whole file of tests did not run)
    skipped = [r for r in skipped if OPTIONAL_ORACLE not in getattr(r, "keywords", {})]
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        print(f"\n{REQUIRE_ORACLES_ENV}=1 forbids skips: {report.nodeid}: {reason}")
    if skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
