#!/usr/bin/env bash
# nvfp4-cpu on AArch64 without an AArch64 machine: cross-build the library (NEON + portable)
# with zig cc against glibc 2.28, as a manylinux_2_28_aarch64 wheel checked by auditwheel
# (scripts/check_manylinux.py), run an AArch64 CPython under qemu-user, and run the package's
# own tests there (every NEON kernel call compared bit for bit with the portable level, see
# tests/conftest.py). With --conformance, also certify the cpu backend on tiers T0-T5
# (NVFP4_CPU_ISA=neon); the certificate says "aarch64 under emulation".
#
#   packages/nvfp4-cpu/scripts/aarch64_emulated.sh [--conformance] [--fresh] [-- PYTEST_ARGS]
#   nox -s cpu-aarch64 [-- --conformance]          (the same script)
#
# Needs: an x86-64 Debian (or derivative with Debian's arm64 archive) machine, root for the
# one-time `apt-get install qemu-user` (skipped when it is there), and the package indexes
# (Debian's archive for the arm64 Python, PyPI for numpy & co. and for zig: `ziglang`).
# The AArch64 Python comes from Debian's arm64 packages, downloaded with a private apt
# configuration (this machine's dpkg architectures are left alone) and unpacked with
# dpkg-deb into a sysroot; numpy / ml_dtypes / pytest / hypothesis are PyPI's aarch64
# wheels, installed with pip --target --platform; nvfp4-core (and the suite) are built as
# wheels, nvfp4-cpu as a py3-none-manylinux_2_28_aarch64 wheel (CC="python -m ziglang cc
# -target aarch64-linux-gnu.2.28", the zig of the host venv: ZIGLANG below, as nox -s build).
#
# Everything lives under $NVFP4_AARCH64_WORKDIR (default: <repo>/.nox/aarch64-emulated);
# the sysroot is kept between runs (--fresh rebuilds it), the wheels and site are rebuilt.
# Any step that cannot be done is an error with the reason (exit status 1): this script
# never skips, and its pytest run sets NVFP4_REQUIRE_ORACLES=1 (a skipped test fails).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKG=$(dirname "$HERE")
ROOT=$(cd "$PKG/../.." && pwd)
WORK=${NVFP4_AARCH64_WORKDIR:-$ROOT/.nox/aarch64-emulated}
CONFORMANCE=0
FRESH=0
PYTEST_ARGS=()

die() {
    echo "aarch64_emulated: ERROR: $*" >&2
    exit 1
}
log() { echo "aarch64_emulated: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --conformance) CONFORMANCE=1 ;;
    --fresh) FRESH=1 ;;
    -h | --help)
        sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --)
        shift
        PYTEST_ARGS=("$@")
        break
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done

START=$SECONDS
[ "$(uname -s)" = Linux ] || die "needs Linux (qemu-user and Debian's packages); this is $(uname -s)"
HOST=$(uname -m)
[ "$HOST" != aarch64 ] || die "this machine is AArch64: run the tests natively (nox -s tests)"
command -v python3 >/dev/null || die "no python3 on PATH (the host builds the wheels)"

# ------------------------------------------------------------------ 1. toolchain
# The compiler is zig (PyPI's ziglang, in the host venv of step 4): it carries its own
# AArch64 glibc 2.28 stubs and headers, so no cross gcc or arm64 libc6-dev is needed.
# The same release and glibc as noxfile.py's ZIGLANG and CPU_WHEEL_GLIBC (the repository's
# tests/test_cpu_wheel_build.py compares them).
ZIGLANG=ziglang==0.17.1
GLIBC=2.28
missing=()
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]}"
    apt-get update -q >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
fi
QEMU_VERSION=$(qemu-aarch64 --version | head -n1 | sed -n 's/.*version \([^ ]*\).*/\1/p')

# ------------------------------------------------------------------ 2. the arm64 Python sysroot
SYSROOT=$WORK/sysroot
[ $FRESH = 0 ] || rm -rf "$SYSROOT" "$WORK/apt"
if [ ! -f "$SYSROOT/.complete" ]; then
    command -v apt-get >/dev/null || die "no apt-get: the AArch64 Python comes from Debian's arm64 packages"
    rm -rf "$SYSROOT" "$WORK/apt"
    APT=$WORK/apt
    mkdir -p "$APT"/{lists/partial,cache/archives/partial,sources,debs} "$SYSROOT"
    : >"$APT/status"
    # this machine's sources (Debian's archive), read for arm64 only, in a private state dir
    found=0
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        cp "$f" "$APT/sources/"
        found=1
    done
    [ $found = 1 ] || die "no apt sources under /etc/apt"
    cat >"$APT/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
Dir::State "$APT";
Dir::State::Lists "$APT/lists";
Dir::State::status "$APT/status";
Dir::Cache "$APT/cache";
Dir::Etc::SourceList "/dev/null";
Dir::Etc::SourceParts "$APT/sources";
EOF
    export APT_CONFIG=$APT/apt.conf
    log "fetching Debian's arm64 index"
    apt-get update -q >"$APT/update.log" 2>&1 || die "apt-get update (arm64) failed: $(tail -n3 "$APT/update.log")"
    # the interpreter, its standard library and their run-time closure (libc6 included);
    # libstdc++6 for numpy's C++ parts
    pkgs=$(apt-get -s install --no-install-recommends python3-minimal libpython3-stdlib libstdc++6 2>/dev/null |
        awk '/^Inst /{print $2}')
    [ -n "$pkgs" ] || die "apt could not resolve python3-minimal for arm64 (are the sources Debian's?)"
    # shellcheck disable=SC2086  # one package per word
    (cd "$APT/debs" && apt-get download -q $pkgs >"$APT/download.log" 2>&1) ||
        die "downloading the arm64 packages failed: $(tail -n3 "$APT/download.log")"
    for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$SYSROOT" || die "dpkg-deb -x $deb failed"; done
    unset APT_CONFIG
    # qemu -L falls back to the host's file where the sysroot lacks one: give the
    # interpreter's site directories empty sysroot twins, so no host module is ever imported
    mkdir -p "$SYSROOT/usr/lib/python3/dist-packages" "$SYSROOT/usr/local/lib"
    for d in "$SYSROOT"/usr/lib/python3.*/; do
        mkdir -p "$SYSROOT/usr/local/lib/$(basename "$d")/dist-packages"
    done
    [ -x "$SYSROOT/usr/bin/python3" ] || die "the arm64 packages hold no usr/bin/python3"
    touch "$SYSROOT/.complete"
    rm -rf "$APT/debs"
fi

# ------------------------------------------------------------------ 3. the emulated interpreter
PY=$WORK/bin/python3
mkdir -p "$WORK/bin"
# -0 sets argv[0]: sys.executable is this wrapper, so the tests' subprocesses are emulated too
cat >"$PY" <<EOF
#!/bin/sh
exec qemu-aarch64 -L "$SYSROOT" -0 "$PY" "$SYSROOT/usr/bin/python3" "\$@"
EOF
chmod +x "$PY"
PYVER=$("$PY" -c 'import platform, sys; assert platform.machine() == "aarch64"; print("%d.%d" % sys.version_info[:2])') ||
    die "the AArch64 Python does not start under qemu-aarch64"
log "emulated Python $PYVER ($SYSROOT)"

# ------------------------------------------------------------------ 4. wheels (host) and site (arm64)
HOSTVENV=$WORK/host-venv
if [ ! -x "$HOSTVENV/bin/python" ] || ! "$HOSTVENV/bin/python" -c "import hatchling, auditwheel" 2>/dev/null; then
    rm -rf "$HOSTVENV"
    python3 -m venv "$HOSTVENV" || die "python3 -m venv failed"
    "$HOSTVENV/bin/python" -m pip install -q --upgrade pip "hatchling>=1.24" wheel "auditwheel>=6.8" ||
        die "installing hatchling and auditwheel into $HOSTVENV failed"
fi
"$HOSTVENV/bin/python" -m pip install -q "$ZIGLANG" || die "installing $ZIGLANG into $HOSTVENV failed"
ZIG_CC="\"$HOSTVENV/bin/python\" -m ziglang cc -target aarch64-linux-gnu.$GLIBC" # split as a shell does
log "toolchain: zig $("$HOSTVENV/bin/python" -m ziglang version) (zig cc -target aarch64-linux-gnu.$GLIBC), qemu-aarch64 $QEMU_VERSION"
WHEELS=$WORK/wheels
rm -rf "$WHEELS"
dirs=("$ROOT/packages/nvfp4-core" "$PKG")
[ $CONFORMANCE = 0 ] || dirs+=("$ROOT/conformance")
CC=$ZIG_CC NVFP4_CPU_ALLOW_NO_LIBRARY=0 "$HOSTVENV/bin/python" -m pip wheel -q \
    --no-deps --no-build-isolation -w "$WHEELS" "${dirs[@]}" || die "building the wheels failed"
"$HOSTVENV/bin/python" - "$WHEELS" "${GLIBC/./_}" <<'EOF' || die "the nvfp4-cpu wheel is not an AArch64 build"
import struct, sys, zipfile
from pathlib import Path
(whl,) = Path(sys.argv[1]).glob(f"nvfp4_cpu-*-py3-none-manylinux_{sys.argv[2]}_aarch64.whl")
elf = zipfile.ZipFile(whl).read("nvfp4_cpu/libnvfp4cpu.so")[:20]
assert elf[:4] == b"\x7fELF" and struct.unpack("<H", elf[18:20])[0] == 183, "not EM_AARCH64"
print(f"aarch64_emulated: {whl.name}: AArch64 library inside", file=sys.stderr)
EOF
"$HOSTVENV/bin/python" "$HERE/check_manylinux.py" "$WHEELS"/nvfp4_cpu-*.whl --glibc "$GLIBC" >&2 ||
    die "the nvfp4-cpu wheel is not manylinux_${GLIBC/./_}_aarch64 (see above)"
SITE=$WORK/site
rm -rf "$SITE"
"$HOSTVENV/bin/python" -m pip install -q --target "$SITE" --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --platform linux_aarch64 \
    --python-version "$PYVER" --implementation cp --abi "cp${PYVER/./}" \
    "$WHEELS"/*.whl numpy ml_dtypes "pytest>=8" "hypothesis>=6.100" ||
    die "installing the aarch64 wheels into $SITE failed"

# ------------------------------------------------------------------ 5. run
RUN=$WORK/run # outside the tree: the installed packages are imported, not the sources
rm -rf "$RUN"
mkdir -p "$RUN"
cd "$RUN"
export PYTHONPATH=$SITE
export NVFP4_EMULATOR="qemu-aarch64 $QEMU_VERSION on an $HOST host"
"$PY" - <<'EOF' || die "the AArch64 build does not offer NEON under qemu-aarch64"
from nvfp4_cpu import CPUBackend
from nvfp4_cpu._native import load
native = load()
assert native.compiled("neon"), "NEON is not built in"
assert native.best_isa() == "neon", native.supported_levels()
print(f"aarch64_emulated: {CPUBackend().availability().device}; levels {native.supported_levels()}")
EOF

log "nvfp4-cpu tests (every level this emulated CPU runs: portable, neon)"
LOG=$WORK/pytest.log
status=0
NVFP4_REQUIRE_ORACLES=1 "$PY" -m pytest -q -ra -p no:cacheprovider "$PKG/tests" "${PYTEST_ARGS[@]}" 2>&1 |
    tee "$LOG" || status=$?
[ "$status" = 0 ] || die "the nvfp4-cpu tests failed under emulation (exit status $status; log: $LOG)"
if [ ${#PYTEST_ARGS[@]} = 0 ]; then
    for verb in qmm gather_qmm dequantize; do
        grep -Eq "^neon/$verb +[1-9][0-9]* calls" "$LOG" ||
            die "no NEON $verb call was compared with the portable level (log: $LOG)"
    done
fi

if [ $CONFORMANCE = 1 ]; then
    CERT=$ROOT/reports/conformance-cpu-aarch64-emulated.json
    mkdir -p "$(dirname "$CERT")"
    log "conformance, cpu backend at NEON, tiers T0-T5 (T6 needs torch: not run under emulation)"
    status=0
    NVFP4_CPU_ISA=neon "$PY" -m nvfp4_conformance run --backend cpu --certificate "$CERT" \
        -- --nvfp4-tiers T0,T1,T2,T3,T4,T5 -p no:cacheprovider || status=$?
    "$PY" - "$CERT" <<'EOF' || die "the certificate does not say what ran ($CERT)"
import json, sys
cert = json.load(open(sys.argv[1]))
assert "aarch64 under emulation" in cert["device"], cert["device"]
assert "NEON" in cert["device"], cert["device"]
print(f"aarch64_emulated: certificate: {cert['result']}; device: {cert['device']}")
EOF
    [ "$status" = 0 ] || die "conformance T0-T5 failed under emulation (exit status $status; $CERT)"
fi

log "done in $((SECONDS - START)) s"
