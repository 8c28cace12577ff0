"""nvfp4.hardware: the machine probes (the CPU's model name, GPU driver evidence)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvfp4 import hardware


@pytest.mark.parametrize(
    ("cpuinfo", "want"),
    [
        (
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nflags\t\t: avx2\n",
            "AMD EPYC (x86 family 25, model 17)",
        ),
        (
            "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n",
            "ARM implementer 0x41 part 0xd0c",
        ),
    ],
)
def test_cpu_model_names_the_family_and_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpuinfo: str, want: str
) -> None:
    """A VM that reports only "AMD EPYC" still tells Zen 3 from Zen 4 through the x86 family
    and model numbers the certificates record beside the name."""
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo)
    real_path = hardware.Path
    monkeypatch.setattr(
        hardware, "Path", lambda p: real_path(fake) if p == "/proc/cpuinfo" else real_path(p)
    )
    assert hardware.cpu_model() == want


def test_cpuinfo_reads_the_first_processor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first processor's fields, values stripped; a second processor's are ignored; a
    machine without /proc/cpuinfo gives no fields."""
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nflags\t\t: avx2 fma \n\nprocessor\t: 1\nflags\t\t: sse2\n")
    real_path = hardware.Path
    monkeypatch.setattr(
        hardware, "Path", lambda p: real_path(fake) if p == "/proc/cpuinfo" else real_path(p)
    )
    assert hardware.cpuinfo() == {"processor": "0", "flags": "avx2 fma"}
    monkeypatch.setattr(hardware, "Path", lambda p: real_path(tmp_path / "absent"))
    assert hardware.cpuinfo() == {}
