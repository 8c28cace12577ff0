"""The build hook's wheel tag (``hatch_build.py``): a compiler whose target pins a glibc
version (``zig cc -target x86_64-linux-gnu.2.28``) gives a ``manylinux_2_28_x86_64`` wheel;
the architecture comes from that target, never from this machine. And the check of the built
wheel (``scripts/check_manylinux.py``) on ``auditwheel show --json`` reports as auditwheel 6.8
writes them. Nothing is compiled or run here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

PKG = Path(__file__).resolve().parents[1]


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"nvfp4cpu_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hook() -> ModuleType:
    return _load(PKG / "hatch_build.py")


def _checker() -> ModuleType:
    return _load(PKG / "scripts" / "check_manylinux.py")


@pytest.mark.parametrize(
    ("cc", "tag"),
    [
        ("zig cc -target x86_64-linux-gnu.2.28", "manylinux_2_28_x86_64"),
        ("python -m ziglang cc -target aarch64-linux-gnu.2.28", "manylinux_2_28_aarch64"),
        ("zig cc --target=x86_64-linux-gnu.2.17", "manylinux_2_17_x86_64"),
        ("clang -target aarch64-unknown-linux-gnu.2.31 -O2", "manylinux_2_31_aarch64"),
    ],
)
def test_a_glibc_pinned_target_gives_its_manylinux_tag(cc: str, tag: str) -> None:
    hook = _hook()
    assert hook.wheel_platform_tag(cc.split()) == tag


@pytest.mark.parametrize(
    "cc",
    [
        "zig cc -target x86_64-linux-gnu",  # zig's default glibc, not a stated one
        "zig cc -target x86_64-linux-musl",
        "clang --target=aarch64-linux-gnu",
    ],
)
def test_a_target_without_a_glibc_version_pins_nothing(cc: str) -> None:
    assert _hook().glibc_pin(cc.split()) is None


def test_the_architecture_comes_from_the_target() -> None:
    hook = _hook()
    assert hook.target_machine(["zig", "cc", "-target", "aarch64-linux-gnu.2.28"]) == "aarch64"
    assert hook.target_machine(["clang", "--target=x86_64-pc-linux-gnu"]) == "x86_64"


#: ``auditwheel show --json`` on the zig-built x86-64 wheel (glibc 2.28 target: no symbol
#: newer than GLIBC_2.17, no library outside the manylinux policy).
REPORT_ZIG = {
    "version": 1,
    "wheel": "nvfp4_cpu-0.1.0-py3-none-manylinux_2_28_x86_64.whl",
    "pure": False,
    "overall_tag": "manylinux_2_17_x86_64",
    "sym_tag": "manylinux_2_17_x86_64",
    "pyfpe": False,
    "ucs2": False,
    "unsupported_isa": False,
    "versioned_symbols": {
        "libc.so.6": ["GLIBC_2.14", "GLIBC_2.17", "GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.6"],
        "libm.so.6": ["GLIBC_2.2.5"],
        "libpthread.so.0": ["GLIBC_2.2.5"],
    },
    "external_libs": {},
    "policy_upgrades": {},
}


@pytest.mark.parametrize("tag", ["manylinux_2_17_x86_64", "manylinux2014_x86_64"])
def test_a_wheel_for_an_older_glibc_passes(tag: str) -> None:
    report = {**REPORT_ZIG, "overall_tag": tag}
    assert _checker().check_report(report, (2, 28), "x86_64") == tag


@pytest.mark.parametrize(
    ("tag", "arch"),
    [
        ("manylinux_2_34_x86_64", "x86_64"),  # built against this machine's glibc 2.36
        ("linux_x86_64", "x86_64"),  # a library no manylinux policy allows
        ("manylinux_2_17_x86_64", "aarch64"),  # another architecture's library
    ],
)
def test_a_newer_glibc_or_another_architecture_fails_in_one_line(tag: str, arch: str) -> None:
    report = {**REPORT_ZIG, "overall_tag": tag}
    with pytest.raises(ValueError, match=rf"^expected .* manylinux_2_28_{arch} .*; found '{tag}'$"):
        _checker().check_report(report, (2, 28), arch)


def test_an_auditwheel_error_fails_in_one_line() -> None:
    report = {"version": 1, "wheel": "x.whl", "error": "cannot read x.whl"}
    with pytest.raises(ValueError, match=r"found its error 'cannot read x.whl'$"):
        _checker().check_report(report, (2, 28), "x86_64")


def test_the_wheel_name_must_carry_the_glibc_asked_for() -> None:
    check = _checker()
    good = Path("nvfp4_cpu-0.1.0-py3-none-manylinux_2_28_aarch64.whl")
    assert check.wheel_arch(good, (2, 28)) == "aarch64"
    for bad in ("nvfp4_cpu-0.1.0-py3-none-linux_x86_64.whl", REPORT_ZIG["wheel"]):
        with pytest.raises(ValueError, match=r"expected a wheel tagged py3-none-manylinux_2_17_"):
            check.wheel_arch(Path(str(bad)), (2, 17))
