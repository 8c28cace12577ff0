"""Cheap probes of the machine: which vendor's GPU driver is loaded, the CPU's model, and the
first processor's fields of Linux's ``/proc/cpuinfo`` (the benchmarks' SIMD flags and
nvfp4-cpu's tests read them too).

No library is loaded and nothing is initialised: the probe looks for the files a loaded
driver creates. The registry uses it to hint at a backend that is not installed, and the
GPU backends to tell "no driver here" apart from "a driver, but a torch without GPU
support". (The repository's noxfile carries the same table in ``.ci/install_targets.py``,
since it runs before any package is installed; a test keeps the two equal.)
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["DRIVER_PATHS", "cpu_model", "cpuinfo", "driver_evidence"]

#: Files that exist where a GPU driver is loaded, by vendor.
DRIVER_PATHS: dict[str, tuple[str, ...]] = {
    "nvidia": ("/dev/nvidiactl", "/proc/driver/nvidia/version"),
    "amd": ("/dev/kfd",),
}


def driver_evidence(vendor: str) -> str:
    """The path showing that a GPU driver of ``vendor`` ("nvidia" or "amd") is loaded, or ''
    when none is."""
    return next((p for p in DRIVER_PATHS[vendor] if Path(p).exists()), "")


def cpuinfo() -> dict[str, str]:
    """The first processor's fields of Linux's ``/proc/cpuinfo`` (``"model name"``,
    ``"flags"``, ``"CPU part"``, ...; a later processor's repeat of a key is ignored), empty
    where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str | None:
    """The CPU's model name as the operating system reports it (Linux ``/proc/cpuinfo``'s
    ``model name``, with the x86 family and model numbers, which tell Zen 3 from Zen 4 where
    a VM reports only "AMD EPYC"; or its ``CPU implementer`` / ``CPU part`` on ARM; macOS'
    ``machdep.cpu.brand_string``), or None. Under qemu-user this is the host's CPU
    (``platform.emulation`` says so)."""
    fields = cpuinfo()
    if fields.get("model name") and fields.get("cpu family") and fields.get("model"):
        return (
            f"{fields['model name']} (x86 family {fields['cpu family']}, model {fields['model']})"
        )
    for key in ("model name", "Model", "Hardware"):
        if fields.get(key):
            return fields[key]
    if fields.get("CPU part"):
        return f"ARM implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    if sys.platform == "darwin":
        import subprocess

        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
        except OSError:
            out = ""
        return out or None
    return None
