"""What machine a benchmark ran on, read once for every script: the CPU's model name with its
x86 family / model numbers (a VM often reports only "AMD EPYC", and the numbers tell Zen 3
from Zen 4 or Zen 5), its SIMD flags, its memory, and the installed version of a
distribution. Linux reads ``/proc/cpuinfo``; elsewhere the platform module's answer stands."""

from __future__ import annotations

import importlib.metadata
import os
import platform

#: The flag prefixes a summary lists (the ISA paths our kernels can take).
SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "asimd", "sve")


def cpu_model() -> str:
    """``"AMD EPYC (x86 family 25, model 17)"``: nvfp4-core's probe (the one the certificates
    use: the model name and, on x86, its family and model numbers), else the platform's
    processor or machine name."""
    from nvfp4.hardware import cpu_model as probe

    return probe() or platform.processor() or platform.machine()


def simd_flags() -> list[str]:
    """The CPU's SIMD feature flags (sorted), empty where the OS does not list them."""
    from nvfp4.hardware import cpuinfo

    f = cpuinfo()
    flags = (f.get("flags") or f.get("Features") or "").split()
    return sorted(f for f in flags if f.startswith(SIMD_PREFIXES))


def ram_bytes() -> int | None:
    """Physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (None where it is not installed)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
