"""Cheap probes for GPU drivers: which vendor's driver is loaded on this machine.

No library is loaded and nothing is initialised: the probe looks for the files a loaded
driver creates. The registry uses it to hint at a backend that is not installed, and the
GPU backends to tell "no driver here" apart from "a driver, but a torch without GPU
support". (The repository's noxfile carries the same table in ``.ci/install_targets.py``,
since it runs before any package is installed; a test keeps the two equal.)
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DRIVER_PATHS", "driver_evidence"]

#: Files that exist where a GPU driver is loaded, by vendor.
DRIVER_PATHS: dict[str, tuple[str, ...]] = {
    "nvidia": ("/dev/nvidiactl", "/proc/driver/nvidia/version"),
    "amd": ("/dev/kfd",),
}


def driver_evidence(vendor: str) -> str:
    """The path showing that a GPU driver of ``vendor`` ("nvidia" or "amd") is loaded, or ''
    when none is."""
    return next((p for p in DRIVER_PATHS[vendor] if Path(p).exists()), "")
