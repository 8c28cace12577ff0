"""A run under qemu-user is never certified as the emulated machine: the evidence the
process sees (its name, a /proc/cpuinfo of another architecture) and the runner's word
($NVFP4_EMULATOR) make the device read "aarch64 under emulation (...)", and the Markdown
marks the platform emulated."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from nvfp4_conformance import emulation
from nvfp4_conformance.certificate import render_markdown

X86_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\n"


def _fake(monkeypatch: pytest.MonkeyPatch, machine: str, comm: str, cpuinfo: str) -> None:
    files = {"/proc/self/comm": comm, "/proc/cpuinfo": cpuinfo}
    monkeypatch.setattr(emulation, "_read", lambda path: files.get(path, ""))
    monkeypatch.setattr(emulation.platform, "machine", lambda: machine)
    monkeypatch.delenv(emulation.EMULATOR_ENV, raising=False)


def test_native_runs_are_native(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "aarch64", "python3\n", ARM_CPUINFO)
    assert emulation.detect() is None
    _fake(monkeypatch, "x86_64", "python3\n", X86_CPUINFO)
    assert emulation.detect() is None
    assert emulation.describe(None) is None


def test_qemu_user_started_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "aarch64", "qemu-aarch64\n", X86_CPUINFO)
    found = emulation.detect()
    assert found is not None
    assert found["declared"] is None
    assert len(found["detected"] or []) == 2  # the name and the foreign cpuinfo
    assert emulation.describe(found) == "aarch64 under emulation (qemu-user)"


def test_foreign_cpuinfo_alone_and_the_runners_word(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "aarch64", "python3\n", X86_CPUINFO)  # binfmt_misc: no qemu name
    monkeypatch.setenv(emulation.EMULATOR_ENV, "qemu-aarch64 7.2.22 on an x86_64 host")
    found = emulation.detect()
    assert found is not None
    assert found["detected"] == ["/proc/cpuinfo describes an x86 CPU, uname says aarch64"]
    assert emulation.describe(found) == (
        "aarch64 under emulation (qemu-aarch64 7.2.22 on an x86_64 host)"
    )


def test_the_markdown_marks_an_emulated_platform() -> None:
    data = Path(__file__).with_name("data") / "certificate-reference.json"
    cert: dict[str, Any] = json.loads(data.read_text(encoding="utf-8"))
    assert "(emulated)" not in render_markdown(cert)
    emulated = copy.deepcopy(cert)
    emulated["platform"]["machine"] = "aarch64"
    emulated["platform"]["emulation"] = {"detected": ["..."], "declared": None}
    emulated["device"] = "aarch64 under emulation (qemu-user): aarch64 NEON, 2 threads"
    md = render_markdown(emulated)
    assert "| platform | Linux aarch64 (emulated), " in md
    assert "aarch64 under emulation (qemu-user)" in md
