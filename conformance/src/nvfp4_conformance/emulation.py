"""Whether this run executes under a user-mode CPU emulator (qemu-user), so that a
certificate never presents an emulated CPU as the machine it ran on.

Two kinds of facts are recorded, kept apart:

* ``detected``: what the process can see of the emulation itself, none of which a native run
  shows:

  - ``/proc/self/comm`` (the name the kernel gave the process at exec) is ``qemu-<arch>``:
    the interpreter was started as ``qemu-aarch64 python3 ...``;
  - ``/proc/cpuinfo`` describes another architecture's CPU than :func:`platform.machine`
    (qemu-user 7 passes the host's file through: x86 ``vendor_id`` / ``flags`` lines under an
    ``aarch64`` uname).

* ``declared``: ``$NVFP4_EMULATOR``, set by a runner that starts the emulator itself
  (``packages/nvfp4-cpu/scripts/aarch64_emulated.sh`` sets it to the qemu version and the
  host): a claim, recorded as the runner's.

A run with neither is reported as native. The certificate's device then reads
``"<machine> under emulation (...): <the backend's device>"`` and ``platform.emulation``
holds both lists.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["EMULATOR_ENV", "describe", "detect"]

#: Set by a runner that runs the suite under an emulator: what it runs (e.g.
#: "qemu-aarch64 7.2.22 on an x86_64 host").
EMULATOR_ENV = "NVFP4_EMULATOR"

_X86 = ("x86_64", "amd64", "i386", "i486", "i586", "i686")
_ARM = ("aarch64", "arm64", "armv7l", "armv8l")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cpuinfo_arch(text: str) -> str | None:
    """The architecture family /proc/cpuinfo describes ("x86" / "arm"), if it says."""
    keys = {line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line}
    if "vendor_id" in keys or "flags" in keys:
        return "x86"
    if "CPU implementer" in keys or "Features" in keys:
        return "arm"
    return None


def detect() -> dict[str, list[str] | str | None] | None:
    """``{"detected": [evidence, ...], "declared": text or None}``, or ``None`` for a run with
    no sign of emulation."""
    evidence: list[str] = []
    comm = _read("/proc/self/comm").strip()
    if comm.startswith("qemu-"):
        evidence.append(f"/proc/self/comm is {comm!r}: the process is qemu-user")
    machine = platform.machine().lower()
    family = "x86" if machine in _X86 else "arm" if machine in _ARM else None
    described = _cpuinfo_arch(_read("/proc/cpuinfo"))
    if family and described and described != family:
        evidence.append(
            f"/proc/cpuinfo describes an {described} CPU, uname says {platform.machine()}"
        )
    declared = os.environ.get(EMULATOR_ENV) or None
    if not evidence and declared is None:
        return None
    return {"detected": evidence, "declared": declared}


def describe(found: dict[str, list[str] | str | None] | None) -> str | None:
    """The words the certificate's device starts with, e.g. "aarch64 under emulation
    (qemu-aarch64 7.2.22 on an x86_64 host)"; ``None`` for a native run."""
    if found is None:
        return None
    how = found.get("declared") or "qemu-user"
    return f"{platform.machine()} under emulation ({how})"
