"""Shared set-up for the nvfp4-cpu tests.

* ``isa`` is parametrized over every instruction-set level this build and this CPU support
  (never over the ones it lacks, so nothing is skipped to pass); ``test_native.py`` checks
  independently (``/proc/cpuinfo``, ``/proc/self/auxv``) that no level this CPU has was left
  out.
* Levels in ``cpu_helpers.BIT_IDENTICAL_TO_PORTABLE`` (NEON) promise more than the
  tolerances: every kernel call such a level makes in any test is repeated at the portable
  level, in the same process, and the two outputs must be equal byte for byte (a mismatch
  fails the test that made the call). The counts are printed at the end of the run.
* Every error measured through ``cpu_helpers.check_close`` is printed at the end of the run.
* As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` (set by CI) turns any skip into a failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cpu_helpers import BIT_IDENTICAL_TO_PORTABLE, CROSS_CHECKED, MEASURED
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
from nvfp4.tolerances import tolerance
from nvfp4_cpu import _native
from nvfp4_cpu._native import ISA_LEVELS, load

_PORTABLE = ISA_LEVELS.index("portable")
_ESIZE = {0: 4, 1: 2, 2: 2}  # dequantize's output kinds (NV_OUT_*): bytes per element


class _CrossCheckedLib:
    """The loaded library, except that each qmm / gather_qmm / dequantize call (W4A16 and W4A8
    int8) at a level of
    ``BIT_IDENTICAL_TO_PORTABLE`` is run again at the portable level into a scratch buffer,
    and the two outputs must be the same bytes."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._checked = {ISA_LEVELS.index(i) for i in BIT_IDENTICAL_TO_PORTABLE}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def _compare(self, verb: str, isa: int, out: int, mirror: np.ndarray, what: str) -> None:
        got = np.frombuffer(ctypes.string_at(out, mirror.nbytes), dtype=mirror.dtype)
        want = mirror.reshape(-1)
        bits = np.uint32 if mirror.dtype == np.float32 else np.uint16
        diff = np.flatnonzero(got.view(bits) != want.view(bits))
        if diff.size:
            i = int(diff[0])
            raise AssertionError(
                f"{ISA_LEVELS[isa]} {verb} {what}: {diff.size} of {want.size} outputs differ "
                f"from the portable level's bits (first at flat index {i}: "
                f"{got[i]!r} vs portable {want[i]!r})"
            )
        CROSS_CHECKED[f"{ISA_LEVELS[isa]}/{verb}"] += 1

    def _portable(self, name: str, nth: int, args: tuple[Any, ...], size: int, dtype: Any) -> Any:
        """The same call at the portable level, into a fresh buffer of ``size`` elements."""
        mirror = np.empty(size, dtype)
        rc = getattr(self._lib, name)(_PORTABLE, nth, *args, mirror.ctypes.data)
        if rc != 0:
            raise AssertionError(f"portable {name} refused what another level took ({rc})")
        return mirror

    def _matmul(self, name: str, isa: int, nth: int, args: tuple[Any, ...]) -> int:
        """A qmm-shaped call (weight args, n, k, x, m, out)."""
        rc = int(getattr(self._lib, name)(isa, nth, *args))
        if rc == 0 and isa in self._checked:
            n, k, m, out = args[3], args[4], args[6], args[7]
            mirror = self._portable(name, nth, args[:-1], m * n, np.float32)
            self._compare(name.removeprefix("nvfp4cpu_"), isa, out, mirror, f"M={m} N={n} K={k}")
        return rc

    def _gather(self, name: str, isa: int, nth: int, args: tuple[Any, ...]) -> int:
        """A gather-shaped call (weight args, e, n, k, x, m, ids, out)."""
        rc = int(getattr(self._lib, name)(isa, nth, *args))
        if rc == 0 and isa in self._checked:
            e, n, k, m, out = args[3], args[4], args[5], args[7], args[9]
            mirror = self._portable(name, nth, args[:-1], m * n, np.float32)
            what = f"E={e} M={m} N={n} K={k}"
            self._compare(name.removeprefix("nvfp4cpu_"), isa, out, mirror, what)
        return rc

    def nvfp4cpu_qmm(self, isa: int, nth: int, *args: Any) -> int:
        return self._matmul("nvfp4cpu_qmm", isa, nth, args)

    def nvfp4cpu_gather_qmm(self, isa: int, nth: int, *args: Any) -> int:
        return self._gather("nvfp4cpu_gather_qmm", isa, nth, args)

    def nvfp4cpu_qmm_w4a8(self, isa: int, nth: int, *args: Any) -> int:
        return self._matmul("nvfp4cpu_qmm_w4a8", isa, nth, args)

    def nvfp4cpu_gather_qmm_w4a8(self, isa: int, nth: int, *args: Any) -> int:
        return self._gather("nvfp4cpu_gather_qmm_w4a8", isa, nth, args)

    def nvfp4cpu_dequantize(self, isa: int, nth: int, *args: Any) -> int:
        rc = int(self._lib.nvfp4cpu_dequantize(isa, nth, *args))
        if rc == 0 and isa in self._checked:
            e, n, k, kind, out = args[3], args[4], args[5], args[6], args[7]
            dtype = np.float32 if _ESIZE[kind] == 4 else np.uint16
            mirror = self._portable("nvfp4cpu_dequantize", nth, args[:-1], e * n * k, dtype)
            self._compare("dequantize", isa, out, mirror, f"E={e} N={n} K={k} kind={kind}")
        return rc


@pytest.fixture(scope="session", autouse=True)
def _bit_identical_levels_checked_against_portable() -> Iterator[None]:
    """Wraps the loaded library (see ``_CrossCheckedLib``) for the whole session where this
    machine runs a level of ``BIT_IDENTICAL_TO_PORTABLE``."""
    native = load()
    if not any(native.supported(i) for i in BIT_IDENTICAL_TO_PORTABLE):
        yield
        return
    with _native._LOCK:
        _native._STATE = dataclasses.replace(native, lib=_CrossCheckedLib(native.lib))
    try:
        yield
    finally:
        with _native._LOCK:
            _native._STATE = native


def pytest_generate_tests(metafunc: Any) -> None:
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", list(load().supported_levels()))


@pytest.fixture(scope="session")
def native() -> Any:
    return load()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CROSS_CHECKED:
        terminalreporter.write_sep("-", "nvfp4-cpu kernel calls equal to portable, bit for bit")
        for key in sorted(CROSS_CHECKED):
            terminalreporter.write_line(f"{key:<22} {CROSS_CHECKED[key]} calls")
    if not MEASURED:
        return
    terminalreporter.write_sep("-", "nvfp4-cpu measured errors (max|y-ref|/max|ref|)")
    for key in sorted(MEASURED):
        v = MEASURED[key]
        terminalreporter.write_line(
            f"{key:<22} n={len(v):<4} max={max(v):.3e} median={float(np.median(v)):.3e} "
            f"(tolerance {tolerance(*key.split('/')):.1e})"
        )
