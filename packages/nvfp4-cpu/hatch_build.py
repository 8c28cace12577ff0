"""Hatchling build hook: compile the C kernels into one shared library inside the wheel.

The library is plain C11 built with the system compiler (``$CC``, else ``cc``) and loaded at
run time with :mod:`ctypes`; it uses no Python C-API, so one build serves every CPython
version (the wheel is tagged for the platform, see ``build_data`` below).

Translation units, one per instruction-set level (runtime dispatch picks one per call):

* ``api.c``               - entry points, dispatch, thread pool; baseline flags only;
* ``route.c``             - the matmul drivers' work plan (rows by expert, chunks, items);
* ``plan.c``              - the cache plan: cache sizes (env, sysfs, CPUID) and the blocking;
* ``kernels_portable.c``  - plain C, every architecture;
* ``kernels_avx2.c``      - x86-64 only, ``-mavx2 -mfma -mf16c``;
* ``kernels_avx512.c``    - x86-64 only, ``-mavx512f -mavx512bw -mavx512vl`` (+ AVX2/FMA/F16C);
* ``w4a8_api.c``          - the W4A8 entry points and driver; baseline flags only;
* ``w4a8_portable.c``     - W4A8 (int8 activations) in plain C, every architecture;
* ``w4a8_fp8.c``          - the W4A8 FP8 activation encoder, plain C;
* ``w4a8_avx2.c``         - W4A8 with vpmaddubsw / vpmaddwd, x86-64 only, AVX2 flags;
* ``w4a8_avx512vnni.c``   - W4A8 with vpdpbusd, x86-64 only, AVX-512 flags + ``-mavx512vnni``;
* ``kernels_neon.c``      - AArch64 only, no extra flags (Advanced SIMD is in its baseline);
* ``w4a8_neon_dotprod.c`` - W4A8 with vdotq_laneq_s32, AArch64 only, ``-march=armv8.2-a+dotprod``
  (zig cc: ``-mcpu=generic+dotprod``; called only where the CPU reports dotprod).

The units follow the compiler's *target* (``$CC -dumpmachine``), not this machine, so a cross
compiler builds the library of its own architecture: ``CC=aarch64-linux-gnu-gcc python
hatch_build.py OUT_DIR`` on an x86-64 machine builds the AArch64 library (NEON + portable) into
OUT_DIR (``scripts/aarch64_emulated.sh`` runs the tests on it under qemu-user).

A SIMD unit the compiler cannot build is left out with a warning (the library then reports
that level as not compiled). Without a working C compiler the build fails, unless
``NVFP4_CPU_ALLOW_NO_LIBRARY=1`` (the package then imports and says why it is unavailable).

A compiler whose ``-target`` names a glibc version builds a wheel for every Linux with that
glibc or newer: ``CC="python -m ziglang cc -target x86_64-linux-gnu.2.28"`` (zig, PyPI's
``ziglang``, links against the symbol versions of the glibc it is told) gives a
``py3-none-manylinux_2_28_x86_64`` wheel, and ``-target aarch64-linux-gnu.2.28`` its AArch64
twin (``nox -s build`` builds the x86-64 one and checks it with ``auditwheel show``). Any
other compiler links against this machine's glibc: the wheel is then tagged ``linux_<arch>``
(``auditwheel repair`` can retag it for the glibc it needs).

Run ``python hatch_build.py`` to build the library in place into ``src/nvfp4_cpu/`` for a
source checkout (``PYTHONPATH=src``); editable installs do the same automatically.
``python hatch_build.py OUT_DIR`` builds it into OUT_DIR instead.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LIBRARY_NAME = "libnvfp4cpu.so"
HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"

BASE_FLAGS = [
    "-O3",
    "-std=c11",
    "-fPIC",
    "-fvisibility=hidden",
    "-ffp-contract=off",  # exactness: no FMA contraction anywhere the C is not explicit
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-g0",  # no DWARF: zig cc emits it unless told (a 4.6 MB library instead of 0.9 MB)
]

#: Per-unit flags and the define api.c gets when the unit is linked in.
X86_UNITS = {
    "kernels_avx2.c": (["-mavx2", "-mfma", "-mf16c"], "NVFP4CPU_HAVE_AVX2"),
    "kernels_avx512.c": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
        "NVFP4CPU_HAVE_AVX512",
    ),
    "w4a8_avx2.c": (["-mavx2", "-mfma", "-mf16c"], "NVFP4CPU_HAVE_W4A8_AVX2"),
    "w4a8_avx512vnni.c": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"],
        "NVFP4CPU_HAVE_W4A8_AVX512VNNI",
    ),
}
#: The same for AArch64 targets.
AARCH64_UNITS = {
    "kernels_neon.c": ([], "NVFP4CPU_HAVE_NEON"),
    "w4a8_neon_dotprod.c": (["-march=armv8.2-a+dotprod"], "NVFP4CPU_HAVE_W4A8_NEON_DOTPROD"),
}
#: Flags a unit is retried with when the compiler refuses its own: zig cc reads ``-march`` as
#: a CPU name (``armv8.2`` is none) and takes the architecture feature on its generic CPU.
RETRY_FLAGS = {"w4a8_neon_dotprod.c": ["-mcpu=generic+dotprod"]}
#: Units every build needs (plain C): a failure to compile them fails the build.
REQUIRED_UNITS = ("route.c", "plan.c", "kernels_portable.c", "w4a8_portable.c", "w4a8_fp8.c")
#: Baseline units that get the defines of the SIMD units linked in.
DISPATCH_UNITS = ("api.c", "w4a8_api.c")


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or "cc"
    parts = shlex.split(cc)
    if shutil.which(parts[0]) is None:
        raise RuntimeError(
            f"nvfp4-cpu: no C compiler found (tried {cc!r}; set $CC or install gcc / clang)"
        )
    return parts


def _normalise_machine(name: str) -> str:
    name = name.lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(name, name)


def _target_triple(cc: list[str]) -> str | None:
    """The triple of a ``-target TRIPLE`` / ``--target=TRIPLE`` argument in ``cc`` (clang,
    zig cc), else None."""
    for i, arg in enumerate(cc):
        if arg in ("-target", "--target") and i + 1 < len(cc):
            return cc[i + 1]
        if arg.startswith(("-target=", "--target=")):
            return arg.partition("=")[2]
    return None


def target_machine(cc: list[str]) -> str:
    """The architecture ``cc`` compiles for: the first field of its ``-target`` argument if it
    has one (``zig cc -target aarch64-linux-gnu.2.28``, whose ``-dumpmachine`` fails), else of
    ``cc -dumpmachine`` (``aarch64-linux-gnu``, ``x86_64-pc-linux-gnu``,
    ``arm64-apple-darwin23``; gcc and clang both answer), else this machine's
    (``platform.machine()``)."""
    triple = _target_triple(cc) or ""
    if not triple:
        try:
            proc = subprocess.run(
                [*cc, "-dumpmachine"], capture_output=True, text=True, check=False
            )
            triple = proc.stdout.strip() if proc.returncode == 0 else ""
        except OSError:
            triple = ""
    return _normalise_machine(triple.split("-")[0] if triple else platform.machine())


#: A target triple that pins glibc: ``x86_64-linux-gnu.2.28``, ``aarch64-unknown-linux-gnu.2.17``.
_GLIBC_TRIPLE = re.compile(r"[^-]+-(?:[^-]+-)?linux-gnu[a-z0-9]*\.(\d+)\.(\d+)(?:\.\d+)?")


def glibc_pin(cc: list[str]) -> tuple[int, int] | None:
    """The glibc version ``cc`` links against when its ``-target`` names one (zig cc:
    ``-target x86_64-linux-gnu.2.28`` -> ``(2, 28)``), else None (the build machine's)."""
    triple = _target_triple(cc)
    match = _GLIBC_TRIPLE.fullmatch(triple) if triple else None
    return (int(match[1]), int(match[2])) if match else None


def wheel_platform_tag(cc: list[str]) -> str:
    """The wheel's platform tag for a library built by ``cc``: ``manylinux_X_Y_<arch>`` when
    ``cc`` pins glibc X.Y (``-target <arch>-linux-gnu.X.Y``), ``linux_<arch>`` for a cross
    compiler (``$CC`` targets another architecture), else this interpreter's own tag."""
    target = target_machine(cc)
    pin = glibc_pin(cc)
    if pin is not None:
        return f"manylinux_{pin[0]}_{pin[1]}_{target}"
    if target != _normalise_machine(platform.machine()):
        return f"linux_{target}"
    return _platform_tag()


def _units_for(machine: str) -> dict[str, tuple[list[str], str]]:
    """The SIMD units (flags, define) built for a target architecture."""
    if machine in ("x86_64", "i386", "i486", "i586", "i686", "x86"):
        return X86_UNITS
    if machine == "aarch64":
        return AARCH64_UNITS
    return {}


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stderr}")


def build_library(out_dir: Path, src_dir: Path = CSRC) -> Path:
    """Compile and link ``libnvfp4cpu.so`` into ``out_dir``; returns its path."""
    cc = _compiler()
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(os.environ.get("NVFP4_CPU_CFLAGS", ""))
    with tempfile.TemporaryDirectory(prefix="nvfp4cpu-obj-") as tmp:
        objects: list[str] = []
        defines: list[str] = []
        units: dict[str, list[str]] = {unit: [] for unit in REQUIRED_UNITS}
        simd = _units_for(target_machine(cc))
        for unit, (flags, _define) in simd.items():
            units[unit] = flags

        def compile_one(unit: str, flags: list[str]) -> str | None:
            """The object of ``unit``, or None for an optional unit this compiler refuses."""
            obj = str(Path(tmp) / (unit[:-2] + ".o"))
            compile_unit = [*cc, *BASE_FLAGS, *flags, *extra, "-c", str(src_dir / unit), "-o", obj]
            try:
                try:
                    _run(compile_unit)
                except RuntimeError:
                    if unit not in RETRY_FLAGS:
                        raise
                    retry = [*cc, *BASE_FLAGS, *RETRY_FLAGS[unit], *extra]
                    _run([*retry, "-c", str(src_dir / unit), "-o", obj])
            except RuntimeError as exc:
                if unit in REQUIRED_UNITS:
                    raise
                warnings.warn(f"nvfp4-cpu: leaving out {unit}: {exc}", stacklevel=2)
                return None
            return obj

        # the units compile independently: one compiler process per core (the ISA levels'
        # units took 26 s one after another on 2 cores); objects and defines keep the units'
        # order, so the link line is the same whatever finishes first
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            built = list(pool.map(lambda item: compile_one(*item), units.items()))
        for unit, obj in zip(units, built, strict=True):
            if obj is None:
                continue
            objects.append(obj)
            if unit in simd:
                defines.append("-D" + simd[unit][1])
        for unit in DISPATCH_UNITS:
            obj = str(Path(tmp) / (unit[:-2] + ".o"))
            _run([*cc, *BASE_FLAGS, *defines, *extra, "-c", str(src_dir / unit), "-o", obj])
            objects.append(obj)
        target = out_dir / LIBRARY_NAME
        tmp_target = out_dir / (LIBRARY_NAME + ".tmp")
        _run([*cc, "-shared", "-pthread", "-o", str(tmp_target), *objects, "-lm"])
        os.replace(tmp_target, target)  # atomic: a running process keeps its mapped copy
    return target


def _platform_tag() -> str:
    """This interpreter's most specific platform tag that is not manylinux / musllinux
    (the library is built against this machine's libc, as hatchling's own inference does)."""
    from packaging.tags import sys_tags

    tag = next(
        t for t in sys_tags() if "manylinux" not in t.platform and "musllinux" not in t.platform
    )
    return tag.platform


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # running as a script without hatchling
    BuildHookInterface = object  # type: ignore[misc,assignment]


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type,type-arg,unused-ignore]
    """Builds the library for wheel builds (standard: into the wheel; editable: into src/)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        allow_missing = os.environ.get("NVFP4_CPU_ALLOW_NO_LIBRARY") == "1"
        try:
            if version == "editable":
                # the editable wheel's .pth points at src/: build the library next to the code
                build_library(Path(self.root) / "src" / "nvfp4_cpu", Path(self.root) / "csrc")
            else:
                self._tmp = tempfile.mkdtemp(prefix="nvfp4cpu-wheel-")
                lib = build_library(Path(self._tmp), Path(self.root) / "csrc")
                build_data["force_include"][str(lib)] = f"nvfp4_cpu/{LIBRARY_NAME}"
        except RuntimeError as exc:
            if not allow_missing:
                raise
            warnings.warn(f"nvfp4-cpu: building without the C library: {exc}", stacklevel=2)
            return
        # a compiled library inside: the wheel is platform-specific (not purelib)...
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        # ...but not CPython-specific (ctypes, no C-API): py3-none-<platform> rather than the
        # inferred cp3XY-cp3XY-<platform>, so one wheel installs on every CPython 3
        build_data["tag"] = f"py3-none-{wheel_platform_tag(_compiler())}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    path = build_library(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "src" / "nvfp4_cpu")
    print(f"built {path}", file=sys.stderr)
