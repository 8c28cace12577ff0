"""nvfp4-cpu's wheels are built with one zig release against one glibc: the build session's
(``noxfile.ZIGLANG``, ``noxfile.CPU_WHEEL_GLIBC``) and the AArch64 emulation script's, which
builds the AArch64 wheel outside nox."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import noxfile  # noqa: E402

SCRIPT = ROOT / "packages" / "nvfp4-cpu" / "scripts" / "aarch64_emulated.sh"
README = ROOT / "packages" / "nvfp4-cpu" / "README.md"


def _script_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, f"expected a line {name}=... in {SCRIPT.name}; found none"
    return match[1]


def test_the_aarch64_script_uses_the_build_sessions_zig_and_glibc() -> None:
    assert _script_value("ZIGLANG") == noxfile.ZIGLANG
    assert _script_value("GLIBC") == ".".join(map(str, noxfile.CPU_WHEEL_GLIBC))


def test_the_build_sessions_compiler_pins_that_glibc() -> None:
    cc = shlex.split(noxfile.zig_cc("a venv/bin/python", "x86_64"))
    assert cc == ["a venv/bin/python", "-m", "ziglang", "cc", "-target", "x86_64-linux-gnu.2.28"]
    assert noxfile.CHECK_MANYLINUX.is_file()


def test_the_readme_builds_the_wheel_as_the_build_session_does() -> None:
    """nvfp4-cpu's README shows the build session's commands (the examples test leaves the
    block to that session): the same zig pin, target glibc and manylinux check."""
    text = README.read_text(encoding="utf-8")
    glibc = ".".join(map(str, noxfile.CPU_WHEEL_GLIBC))
    for expected in (
        f"pip install build hatchling {noxfile.ZIGLANG} ",
        f'CC="python -m ziglang cc -target x86_64-linux-gnu.{glibc}"',
        f"{noxfile.CHECK_MANYLINUX.relative_to(ROOT)} dist/nvfp4_cpu-*.whl --glibc {glibc}",
    ):
        assert expected in text, f"{README.name}: expected {expected!r}; not found"
