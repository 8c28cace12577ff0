"""Helpers shared by the nvfp4-cpu tests: the spec's error measure against its tolerance,
with every error measured kept for the end-of-run summary; the levels that must equal the
portable level bit for bit, and the count of calls compared so (see conftest.py)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from nvfp4.testing import assert_within
from nvfp4.tolerances import tolerance

MEASURED: dict[str, list[float]] = defaultdict(list)

#: Levels whose kernels do the portable level's float32 operations in its order (no FMA:
#: csrc/kernels_neon.c), so every output equals the portable level's bit for bit. The x86
#: levels fuse multiply-adds and are held to the spec tolerances only.
BIT_IDENTICAL_TO_PORTABLE = ("neon",)
#: Kernel calls of those levels compared with the portable level, by "level/verb".
CROSS_CHECKED: Counter[str] = Counter()


def cpuinfo_field(name: str) -> str:
    """Field ``name`` of the first processor in /proc/cpuinfo (``"flags"``, ``"vendor_id"``,
    ...), read independently of the library; ``""`` where there is no such file or field."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def cpuinfo_flags() -> set[str]:
    """The x86 feature flags of /proc/cpuinfo (empty where there are none)."""
    return set(cpuinfo_field("flags").split())


def check_close(path: str, dtype: str, y: np.ndarray, ref: np.ndarray, label: str = "") -> float:
    """Assert ``y`` is within ``tolerance(path, dtype)`` of ``ref`` (``nvfp4.testing``'s
    measure) and record the error."""
    figs = assert_within(y, ref, tolerance(path, dtype), f"{path} {dtype} {label}")
    MEASURED[f"{path}/{dtype}"].append(figs["max_rel_err"])
    return float(figs["max_rel_err"])
