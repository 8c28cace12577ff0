"""The compiled library, the instruction-set dispatch, threads, and the backend object."""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np
import nvfp4
import pytest
from cpu_helpers import cpuinfo_flags
from nvfp4.backend import Frontend
from nvfp4_cpu import CPUBackend, IsaUnavailable, backend
from nvfp4_cpu._native import ISA_LEVELS, Native, resolve_isa, resolve_threads

#: Linux's AArch64 HWCAP bits (arch/arm64/include/uapi/asm/hwcap.h).
HWCAP_ASIMD, HWCAP_ASIMDDP = 1 << 1, 1 << 20
AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def _auxv_hwcap() -> int:
    """AT_HWCAP from /proc/self/auxv (pairs of native unsigned longs), read independently of
    the library's getauxval; qemu-user serves the emulated CPU's auxv there too."""
    data = Path("/proc/self/auxv").read_bytes()
    size = struct.calcsize("L")
    words = struct.unpack(f"{len(data) // size}L", data[: len(data) // size * size])
    pairs = dict(zip(words[::2], words[1::2], strict=True))
    return int(pairs.get(16, 0))  # AT_HWCAP = 16


def test_library_loads_and_portable_always_runs(native: Native) -> None:
    assert native.path.exists()
    assert native.supported("portable")
    assert native.best_isa() == native.supported_levels()[-1]


def test_dispatch_agrees_with_the_cpu(native: Native) -> None:
    """Every level this CPU can run is built and detected; none it cannot run is offered
    (checked against /proc/cpuinfo and /proc/self/auxv, independently of the library's
    CPUID + XGETBV and getauxval)."""
    if AARCH64:
        assert native.compiled("neon")
        assert not native.compiled("avx2")
        assert not native.compiled("avx512")
        if Path("/proc/self/auxv").exists():  # Linux (and qemu-user)
            hwcap = _auxv_hwcap()
            assert native.has("asimd") == bool(hwcap & HWCAP_ASIMD)
            assert native.has("asimddp") == bool(hwcap & HWCAP_ASIMDDP)
        expected = ("portable", "neon") if native.has("asimd") else ("portable",)
        assert native.supported_levels() == expected
        return
    assert not native.compiled("neon")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert native.supported_levels() == ("portable",)
        assert not native.compiled("avx2")
        assert not native.compiled("avx512")
        return
    assert native.compiled("avx2")
    assert native.compiled("avx512")
    if not Path("/proc/cpuinfo").exists():  # x86-64 without procfs (macOS): detection only
        assert "portable" in native.supported_levels()
        return
    flags = cpuinfo_flags()
    assert native.supported("avx2") == ({"avx2", "fma", "f16c"} <= flags)
    assert native.supported("avx512") == (
        {"avx512f", "avx512bw", "avx512vl", "fma", "f16c"} <= flags
    )


#: The library's x86 feature names and Linux's /proc/cpuinfo flags for the same features.
CPUINFO_NAMES = {
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
}


def test_x86_features_agree_with_proc_cpuinfo(native: Native) -> None:
    """The library's own detection (CPUID leaves 1 and 7, XCR0 by XGETBV) reports exactly the
    features the kernel lists: Linux clears a flag whose register state it does not enable,
    which is the XCR0 check. Elsewhere no x86 feature is reported."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert not native.has("x86")
        assert not any(native.has(name) for name in CPUINFO_NAMES)
        return
    assert native.has("x86")
    flags = cpuinfo_flags()
    if not flags:  # x86-64 without procfs (macOS): nothing independent to compare with
        return
    ours = {name for name in CPUINFO_NAMES if native.has(name)}
    linux = {name for name, flag in CPUINFO_NAMES.items() if flag in flags}
    assert ours == linux, (
        f"expected the features /proc/cpuinfo lists, {sorted(linux)}; "
        f"found {sorted(ours)} (missing {sorted(linux - ours)}, extra {sorted(ours - linux)})"
    )


def test_isa_env_forces_each_supported_level(
    native: Native, monkeypatch: pytest.MonkeyPatch
) -> None:
    for isa in native.supported_levels():
        monkeypatch.setenv("NVFP4_CPU_ISA", isa)
        assert resolve_isa(native) == isa
        assert CPUBackend().isa == isa
    monkeypatch.delenv("NVFP4_CPU_ISA")
    assert resolve_isa(native) == native.best_isa()


def test_unknown_isa_is_refused_clearly(native: Native, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_CPU_ISA", "sse9")
    with pytest.raises(IsaUnavailable, match=r"'sse9' is unknown; expected one of portable"):
        resolve_isa(native)
    b = CPUBackend()
    a = b.availability()
    assert not a.ok
    assert "sse9" in a.reason
    p = nvfp4.quantize(np.ones((2, 16), np.float32))
    with pytest.raises(RuntimeError, match=r"cannot run here: nvfp4-cpu: .*'sse9' is unknown"):
        b.qmm(np.ones((1, 16), np.float32), p)


class _Lacks(Native):
    """The real library, pretending the CPU lacks the level ``LACKS`` (to test the refusal)."""

    LACKS = "avx512"

    def supported(self, isa: str) -> bool:
        return isa != self.LACKS and super().supported(isa)


@pytest.mark.parametrize(
    ("level", "words"),
    [("avx512", "AVX-512 F, BW and VL"), ("neon", r"AArch64 Advanced SIMD \(ASIMD\)")],
)
def test_level_the_cpu_lacks_is_refused_clearly(native: Native, level: str, words: str) -> None:
    fake = _Lacks(native.lib, native.path, native.features)
    fake.LACKS = level  # type: ignore[misc]
    if native.compiled(level):  # built here: refused for the CPU
        match = rf"'{level}' needs {words}.*this CPU lacks"
    else:  # another architecture's level: refused for the build
        match = rf"'{level}' is not built into .*this machine's build has: portable"
    with pytest.raises(IsaUnavailable, match=match):
        resolve_isa(fake, level)
    assert fake.best_isa() != level


def test_threads_argument_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_threads(3) == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            resolve_threads(bad)  # type: ignore[arg-type]
    monkeypatch.setenv("NVFP4_CPU_THREADS", "5")
    assert resolve_threads() == 5
    assert "5 threads" in CPUBackend().availability().device
    monkeypatch.setenv("NVFP4_CPU_THREADS", "zero")
    a = CPUBackend().availability()
    assert not a.ok
    assert "NVFP4_CPU_THREADS" in a.reason
    monkeypatch.delenv("NVFP4_CPU_THREADS")
    assert resolve_threads() == len(os.sched_getaffinity(0))


def test_availability_names_the_isa_and_threads(native: Native) -> None:
    for isa in native.supported_levels():
        a = CPUBackend(isa=isa, threads=2).availability()
        assert a.ok, a.reason
        words = {
            "portable": "portable C",
            "avx2": "AVX2",
            "avx512": "AVX-512 (F/BW/VL)",
            "neon": "aarch64 NEON (+dotprod)" if native.has("asimddp") else "aarch64 NEON",
        }[isa]
        assert words in a.device
        assert ", 2 threads; plan: L1d " in a.device  # then the cache plan (test_plan.py)


def test_backend_contract_and_info() -> None:
    b = backend()
    assert isinstance(b, Frontend)
    assert b.info.name == "cpu"
    assert b.info.priority > 0
    assert b.info.package == "nvfp4-cpu"
    assert "1.0" in b.info.spec_versions
    assert {
        "qmm",
        "gather_qmm",
        "dequantize",
        "quantize_activations",
        "w4a4",
    } <= b.info.capabilities
    a = np.arange(6, dtype=np.float32)
    assert b.to_numpy(b.from_numpy(a)) is not None
    np.testing.assert_array_equal(b.to_numpy(b.from_numpy(a)), a)


def test_registry_picks_cpu_over_reference() -> None:
    try:
        metadata.distribution("nvfp4-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("nvfp4-cpu is not installed (entry points need its metadata)")
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="nvfp4.backends")}
    assert eps.get("cpu") == "nvfp4_cpu:backend"
    assert nvfp4.get_backend("cpu").info.name == "cpu"
    assert nvfp4.get_backend().info.priority >= 50  # the automatic choice is not the reference


def _run_isolated(code: str, **env: str) -> str:
    full = {**os.environ, **env}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def test_missing_library_import_still_works_and_says_why(tmp_path: Path) -> None:
    out = _run_isolated(
        "import nvfp4_cpu; a = nvfp4_cpu.backend().availability(); print(a.ok, '|', a.reason)",
        NVFP4_CPU_LIBRARY=str(tmp_path / "absent.so"),
    )
    ok, reason = out.split("|", 1)
    assert ok.strip() == "False"
    assert "missing" in reason
    assert "absent.so" in reason


def test_broken_library_import_still_works_and_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "libnvfp4cpu.so"
    bad.write_bytes(b"not an ELF file")
    out = _run_isolated(
        "import nvfp4_cpu; a = nvfp4_cpu.backend().availability(); print(a.ok, '|', a.reason)",
        NVFP4_CPU_LIBRARY=str(bad),
    )
    ok, reason = out.split("|", 1)
    assert ok.strip() == "False"
    assert "failed to load" in reason


def test_fork_child_can_use_the_pool(native: Native) -> None:
    """The thread pool is rebuilt in a forked child (workers do not survive fork)."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    b = CPUBackend(threads=2)
    # large enough for the kernel to use both threads (it stays on one for tiny work)
    p = nvfp4.quantize(np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32))
    x = np.ones((3, 1024), np.float32)
    before = b.qmm(x, p)  # starts the pool in the parent
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock the child:
        # forking with the pool's threads alive is what this test does, on purpose
        warnings.filterwarnings(
            "ignore", "This process .* is multi-threaded, use of fork", DeprecationWarning
        )
        pid = os.fork()
    if pid == 0:  # child: must not hang or crash
        code = 0 if np.array_equal(b.qmm(x, p), before) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_levels_are_named_in_enum_order() -> None:
    assert ISA_LEVELS == ("portable", "avx2", "avx512", "neon")


def test_concurrent_callers_share_the_pool_safely(native: Native) -> None:
    """Python threads call multi-threaded kernels at once (ctypes releases the GIL): every
    result equals the single-threaded one, bit for bit."""
    import threading

    rng = np.random.default_rng(3)
    p = nvfp4.quantize(rng.standard_normal((200, 512)).astype(np.float32))
    xs = [rng.standard_normal((m, 512)).astype(np.float32) for m in (1, 3, 9, 30)]
    want = [CPUBackend(threads=1).qmm(x, p) for x in xs]
    b = CPUBackend(threads=3)
    pw = b.prepare(p)
    errors: list[str] = []

    def worker(seed: int) -> None:
        for i in range(60):
            j = (seed + i) % len(xs)
            if not np.array_equal(b.qmm(xs[j], pw).view(np.uint32), want[j].view(np.uint32)):
                errors.append(f"thread {seed} call {i} M={xs[j].shape[0]}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


#: Run in a child with a fresh pool: calls with sleeps between them (each wakes the sleeping
#: workers, the path where a worker may find itself on its caller's CPU and move off it by
#: narrowing its own affinity mask for a moment), then prints, as JSON, whether every result
#: matched the one-thread bits and every thread's CPU mask afterwards.
_AFFINITY_CHILD = """
import json, os, sys, time
import numpy as np, nvfp4
from nvfp4_cpu import CPUBackend
cpus = json.loads(sys.argv[1])
os.sched_setaffinity(0, cpus)  # this thread, before the pool's workers exist: they inherit it
rng = np.random.default_rng(5)
p = nvfp4.quantize(rng.standard_normal((512, 1024)).astype(np.float32))
x = rng.standard_normal((1, 1024)).astype(np.float32)
want = CPUBackend(threads=1).qmm(x, p)
others = set(os.listdir("/proc/self/task")) - {str(os.getpid())}  # e.g. a BLAS's threads
b = CPUBackend(threads=3)
pw = b.prepare(p)
same = True
for i in range(120):
    if i % 4 == 0:
        time.sleep(0.002)  # past the workers' 0.2 ms spin: they sleep, the next call wakes them
    same &= bool(np.array_equal(b.qmm(x, pw).view(np.uint32), want.view(np.uint32)))
ours = set(os.listdir("/proc/self/task")) - others  # the caller and the pool's workers
masks = {t: sorted(os.sched_getaffinity(int(t))) for t in ours}
print(json.dumps({"same": same, "masks": masks}))
"""


@pytest.mark.parametrize("narrow", [False, True], ids=["process-mask", "one-cpu"])
def test_pool_workers_keep_their_cpu_mask(native: Native, narrow: bool) -> None:
    """The pool's workers end every job with the CPU mask they started with (the caller's
    at the pool's creation), whether they had other CPUs to move to or only one, and the
    results are the one-thread bits."""
    import json

    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed[:1] if narrow else allowed
    out = _run_isolated(_AFFINITY_CHILD.replace("sys.argv[1]", repr(json.dumps(cpus))))
    got = json.loads(out.splitlines()[-1])
    assert got["same"]
    assert len(got["masks"]) >= 3  # the caller and its two workers at least
    assert all(mask == cpus for mask in got["masks"].values()), got["masks"]


#: Put a spinning worker on its caller's CPU (a mask of that CPU alone moves a running thread
#: at once; widening the mask again leaves it there), then give it a job long enough that
#: the scheduler lets it run beside the caller: it must move itself to the other CPU and end
#: with its own mask. Prints, per try, the worker's last CPU and its mask, as JSON.
_MIGRATION_CHILD = """
import json, os, sys
import numpy as np, nvfp4
from nvfp4_cpu import CPUBackend
from nvfp4_cpu._native import load
c0, c1 = json.loads(sys.argv[1])
os.sched_setaffinity(0, {c0, c1})
rng = np.random.default_rng(6)
p = nvfp4.quantize(rng.standard_normal((2048, 2048)).astype(np.float32))
x = rng.standard_normal((128, 2048)).astype(np.float32)  # about 10 ms on one thread
others = set(os.listdir("/proc/self/task"))
b = CPUBackend(threads=2)
pw = b.prepare(p)
want = b.qmm(x, pw)  # creates the worker
worker = int(next(iter(set(os.listdir("/proc/self/task")) - others)))
os.sched_setaffinity(0, {c0})  # the caller stays on c0
tries = []
for _ in range(5):
    b.qmm(x[:1], pw)  # the worker spins for 0.2 ms after this
    os.sched_setaffinity(worker, {c0})  # now on c0, beside the caller
    os.sched_setaffinity(worker, {c0, c1})  # free to go, but still on c0
    same = bool(np.array_equal(b.qmm(x, pw), want))
    # where the worker ran once it joined (read by the pool between its two affinity calls:
    # the CPU it was on when the job ended is the scheduler's choice, not the pool's)
    joined = load().lib.nvfp4cpu_pool_join_cpu()
    tries.append({"same": same, "joined": joined, "mask": sorted(os.sched_getaffinity(worker))})
print(json.dumps(tries))
"""


def test_a_worker_on_its_callers_cpu_moves_off_it(native: Native) -> None:
    """A pool worker that joins a job on the CPU its caller runs on moves to another CPU
    of its mask (instead of time-sharing one CPU with its caller) and keeps its mask."""
    import json

    allowed = sorted(os.sched_getaffinity(0))
    assert len(allowed) >= 2, "this check needs two CPUs (CI runners have them)"
    c0, c1 = allowed[:2]
    out = _run_isolated(_MIGRATION_CHILD.replace("sys.argv[1]", repr(json.dumps([c0, c1]))))
    tries = json.loads(out.splitlines()[-1])
    assert all(t["same"] for t in tries)
    assert all(t["mask"] == [c0, c1] for t in tries), tries
    assert all(t["joined"] == c1 for t in tries), tries
