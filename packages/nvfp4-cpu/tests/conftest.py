"""Shared set-up for the nvfp4-cpu tests.

* ``isa`` is parametrized over every instruction-set level this build and this CPU support
  (never over the ones it lacks, so nothing is skipped to pass); ``test_native.py`` checks
  independently (``/proc/cpuinfo``) that no level this CPU has was left out.
* Every error measured through ``cpu_helpers.check_close`` is printed at the end of the run.
* As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` (set by CI) turns any skip into a failure.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cpu_helpers import MEASURED
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
from nvfp4.tolerances import tolerance
from nvfp4_cpu._native import load


def pytest_generate_tests(metafunc: Any) -> None:
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", list(load().supported_levels()))


@pytest.fixture(scope="session")
def native() -> Any:
    return load()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MEASURED:
        return
    terminalreporter.write_sep("-", "nvfp4-cpu measured errors (max|y-ref|/max|ref|)")
    for key in sorted(MEASURED):
        v = MEASURED[key]
        terminalreporter.write_line(
            f"{key:<22} n={len(v):<4} max={max(v):.3e} median={float(np.median(v)):.3e} "
            f"(tolerance {tolerance(*key.split('/')):.1e})"
        )
