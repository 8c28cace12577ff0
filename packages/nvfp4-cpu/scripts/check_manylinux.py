"""Check that an nvfp4-cpu wheel installs on every Linux with glibc GLIBC or newer.

    python scripts/check_manylinux.py WHEEL --glibc 2.28

The wheel must be tagged ``py3-none-manylinux_<X>_<Y>_<arch>`` with X.Y = GLIBC (the build
hook's tag for ``zig cc -target <arch>-linux-gnu.X.Y``), and ``auditwheel show --json`` must
find it consistent with that tag or an older one: its ``overall_tag``, the most compatible
policy the library's symbol versions and dependencies allow, names GLIBC or less and the same
architecture. Prints auditwheel's verdict in one line; any failure is one line on stderr and
exit status 1. Needs ``auditwheel`` (6.8 or newer, for ``--json``) in this interpreter.
``nox -s build`` runs it on the x86-64 wheel, ``scripts/aarch64_emulated.sh`` on the AArch64 one.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

#: The manylinux tags older than PEP 600, by the glibc they stand for.
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def tag_glibc(tag: str) -> tuple[tuple[int, int], str] | None:
    """``(glibc, arch)`` of a manylinux platform tag (``manylinux_2_17_x86_64`` ->
    ``((2, 17), "x86_64")``, ``manylinux2014_aarch64`` -> ``((2, 17), "aarch64")``), else None
    (``linux_x86_64``, a musllinux tag)."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if match:
        return (int(match[1]), int(match[2])), match[3]
    legacy, _, arch = tag.partition("_")
    return (LEGACY[legacy], arch) if legacy in LEGACY and arch else None


def check_report(report: dict[str, object], glibc: tuple[int, int], arch: str) -> str:
    """The ``overall_tag`` of an ``auditwheel show --json`` report when it is a manylinux tag
    of ``arch`` for ``glibc`` or older, else ValueError in one line."""
    want = f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"
    if "error" in report:
        raise ValueError(
            f"expected auditwheel's verdict on {want}; found its error {report['error']!r}"
        )
    tag = str(report.get("overall_tag", ""))
    parsed = tag_glibc(tag)
    if parsed is None or parsed[0] > glibc or parsed[1] != arch:
        raise ValueError(f"expected a wheel consistent with {want} or older; found {tag!r}")
    return tag


def wheel_arch(wheel: Path, glibc: tuple[int, int]) -> str:
    """The architecture of a wheel named ``...-py3-none-manylinux_X_Y_<arch>.whl`` for
    ``glibc`` = (X, Y), else ValueError in one line."""
    want = f"py3-none-manylinux_{glibc[0]}_{glibc[1]}_<arch>"
    match = re.fullmatch(
        rf"[^-]+-[^-]+-py3-none-manylinux_{glibc[0]}_{glibc[1]}_(\w+)\.whl", wheel.name
    )
    if not match:
        raise ValueError(f"expected a wheel tagged {want}; found {wheel.name}")
    return match[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--glibc", required=True, help="the oldest glibc, e.g. 2.28")
    args = parser.parse_args(argv)
    try:
        major, minor = (int(p) for p in args.glibc.split("."))
    except ValueError:
        parser.error(f"--glibc: expected MAJOR.MINOR such as 2.28; found {args.glibc!r}")
    glibc = (major, minor)
    try:
        arch = wheel_arch(args.wheel, glibc)
        proc = subprocess.run(
            [sys.executable, "-m", "auditwheel", "show", "--json", str(args.wheel)],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(
                f"expected auditwheel show's JSON report (exit status {proc.returncode}); "
                f"found {last!r}"
            ) from None
        tag = check_report(report, glibc, arch)
    except ValueError as exc:
        print(f"check_manylinux: {args.wheel.name}: {exc}", file=sys.stderr)
        return 1
    print(
        f"check_manylinux: {args.wheel.name}: auditwheel show: consistent with {tag} "
        f"(symbols: {report.get('sym_tag')}), so with manylinux_{major}_{minor}_{arch}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
