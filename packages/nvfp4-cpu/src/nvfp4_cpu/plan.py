"""The cache plan: the blocking the matmul kernels take from the CPU they run on
(``csrc/plan.h`` says what each number means and how it is derived).

The plan is one per process, held by the library. Where it comes from, first match wins:

1. ``NVFP4_CPU_CACHE`` (e.g. ``l1d=32K,l2=512K,l3=32M``; any subset of the keys, the others
   detected): the plan derived from those caches, so any machine can run, and time, the plan
   another machine would choose. A malformed value is refused with a one-line error.
2. The tuner's choice for this CPU model, level and caches, if ``python -m nvfp4_cpu.tune``
   stored one (:mod:`nvfp4_cpu.tune`; a malformed file is ignored with a one-line warning).
3. The plan derived from this machine's caches (sysfs, else CPUID, else defaults).

No plan changes a result, only speed: the tests compare the bytes of every kernel across plans.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from ._native import Native
from .plans_file import stored_blocking

__all__ = ["CACHE_ENV", "Plan", "apply", "current", "derive", "detect_caches", "parse_cache", "put"]

CACHE_ENV = "NVFP4_CPU_CACHE"
#: The (caches, blocking) apply() took from the tuner's file, if any.
_TUNED: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
#: Where the cache sizes came from, by the C enum value (plan.h's NV_CACHE_*).
SOURCES = ("defaults", "NVFP4_CPU_CACHE", "sysfs", "CPUID", "given")


@dataclass(frozen=True)
class Plan:
    """Caches (bytes) and the blocking derived from them (or chosen by the tuner)."""

    l1d: int
    l2: int
    l3: int
    source: str
    kc: int  # k per slab; 0 = the whole K in one slab
    kp: int  # k per decoded L1 panel (16 or 32)
    group: int  # tiles of 16 output rows per work item (4 or 8)
    tuned: bool = False  # the blocking is the tuner's (nvfp4_cpu.tune), not derived

    @property
    def caches(self) -> tuple[int, int, int]:
        return (self.l1d, self.l2, self.l3)

    @property
    def blocking(self) -> tuple[int, int, int]:
        return (self.kc, self.kp, self.group)

    def describe(self) -> str:
        """One line for availability() and the benchmark summaries."""
        kc = "whole K" if self.kc == 0 else str(self.kc)
        return (
            f"L1d {_size(self.l1d)}, L2 {_size(self.l2)}, L3 {_size(self.l3)} ({self.source}); "
            f"kc {kc}, kp {self.kp}, {self.group} tiles per item{' (tuned)' if self.tuned else ''}"
        )


def _size(n: int) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _arr(values: tuple[int, ...] | list[int]) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


def detect_caches(native: Native) -> tuple[tuple[int, int, int], str]:
    """This machine's (L1d, L2, L3) in bytes and where they came from."""
    out = _arr([0, 0, 0])
    source = int(native.lib.nvfp4cpu_plan_detect(out))
    return (int(out[0]), int(out[1]), int(out[2])), SOURCES[source]


def parse_cache(native: Native, text: str, base: tuple[int, int, int]) -> tuple[int, int, int]:
    """``NVFP4_CPU_CACHE``'s text over ``base`` (the keys it gives replace base's sizes).
    Raises ValueError with one line naming the variable, the item and what was expected."""
    caches = _arr(list(base))
    err = ctypes.create_string_buffer(256)
    shown = repr(text[:60]) + ("..." if len(text) > 60 else "")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = b"\xff"  # refused below as a malformed item
    if b"\x00" in raw:
        raise ValueError(f"${CACHE_ENV}={shown}: holds a NUL byte; expected l1d=32K,l2=512K,l3=32M")
    if native.lib.nvfp4cpu_plan_parse_cache(raw, caches, err, len(err)) != 0:
        raise ValueError(f"${CACHE_ENV}={shown}: {err.value.decode('ascii', 'replace')}")
    return int(caches[0]), int(caches[1]), int(caches[2])


def derive(native: Native, caches: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (kc, kp, group) the library derives from caches (L1d, L2, L3 in bytes)."""
    plan = _arr([0, 0, 0])
    if native.lib.nvfp4cpu_plan_derive(_arr(list(caches)), plan) != 0:
        raise ValueError(f"nvfp4-cpu plan: cache sizes out of range: {caches}")
    return int(plan[0]), int(plan[1]), int(plan[2])


def current(native: Native) -> Plan:
    """The plan in effect in this process."""
    out = _arr([0] * 7)
    native.check(native.lib.nvfp4cpu_plan_get(out), "plan_get")
    v = [int(x) for x in out]
    caches, blocking = (v[0], v[1], v[2]), (v[4], v[5], v[6])
    tuned = (caches, blocking) == _TUNED and SOURCES[v[3]] != "NVFP4_CPU_CACHE"
    return Plan(v[0], v[1], v[2], SOURCES[v[3]], v[4], v[5], v[6], tuned)


def put(
    native: Native, caches: tuple[int, int, int], source: str, blocking: tuple[int, int, int]
) -> Plan:
    """Puts a plan in effect for every later call; ValueError when the library refuses it
    (kc 0 or a multiple of 256 in [256, 16384], kp 16 or 32, group 4 or 8)."""
    rc = native.lib.nvfp4cpu_plan_set(
        _arr(list(caches)), SOURCES.index(source), _arr(list(blocking))
    )
    if rc != 0:
        raise ValueError(
            f"nvfp4-cpu plan: (kc, kp, group) = {blocking} refused: expected kc 0 or a multiple "
            "of 256 in [256, 16384], kp 16 or 32, group 4 or 8"
        )
    return current(native)


def apply(native: Native, isa: str) -> Plan:
    """Puts in effect the plan this process should run at level ``isa`` (the order in the
    module docstring) and returns it. Raises ValueError for a malformed ``NVFP4_CPU_CACHE``."""
    detected, source = detect_caches(native)
    text = os.environ.get(CACHE_ENV)
    if text:
        caches = parse_cache(native, text, detected)
        return put(native, caches, "NVFP4_CPU_CACHE", derive(native, caches))
    global _TUNED
    tuned = stored_blocking(native, isa, detected)
    _TUNED = None if tuned is None else (detected, tuned)
    return put(native, detected, source, tuned or derive(native, detected))
