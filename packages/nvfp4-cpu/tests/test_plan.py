"""The cache plan (csrc/plan.h, nvfp4_cpu.plan): NVFP4_CPU_CACHE parsing (valid values taken,
hostile ones refused in one line), the plan derived from given caches, this machine's caches as
sysfs states them, and the same bytes from every kernel under every plan at every level."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import nvfp4
import pytest
from nvfp4_cpu import CPUBackend, ops, plan, w4a8
from nvfp4_cpu._native import Native
from nvfp4_cpu.layout import prepare

K, M = 1 << 10, 1 << 20
BASE = (48 * K, 2 * M, 64 * M)  # what the keys a value does not give fall back to


@pytest.fixture(autouse=True)
def _restore_plan(native: Native) -> Iterator[None]:
    """Every test leaves the plan in effect as it found it."""
    before = plan.current(native)
    yield
    plan.put(native, before.caches, before.source, before.blocking)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("l1d=32K,l2=512K,l3=32M", (32 * K, 512 * K, 32 * M)),
        ("l2=512K", (BASE[0], 512 * K, BASE[2])),
        ("l3=1G,l1d=48k", (48 * K, BASE[1], 1 << 30)),
        ("l2=524288", (BASE[0], 512 * K, BASE[2])),
        ("l2=2m,l3=0", (BASE[0], 2 * M, 0)),
    ],
)
def test_cache_env_values_taken(native: Native, text: str, want: tuple[int, int, int]) -> None:
    assert plan.parse_cache(native, text, BASE) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("l2", "expected key=size"),
        ("l2=", "expected a size"),
        ("l2=abc", "expected a size"),
        ("l2=512KB", "expected a size"),
        ("l2=-512K", "expected a size"),
        ("l2 =512K", "expected key=size"),
        ("L2=512K", "expected key=size"),
        ("l4=1M", "expected key=size"),
        ("l2=1M,l2=2M", "l2 given twice"),
        ("l2=512K,", "expected key=size"),
        (",l2=512K", "expected key=size"),
        ("l2=1K", "l2 must be 16384 to 1073741824 bytes, found 1024"),
        ("l1d=0", "l1d must be"),
        ("l2=9999999999999G", "expected a size"),
        ("l2=99999999G", "l2 must be"),
        ("l2=512K\nl3=1M", "\\x0A"),
        ("l2=5\x1b[2J12K", "\\x1B"),
        ("l2=512K\x00", "NUL"),
        ("l2=" + "9" * 400, "..."),
        ("l2=\u00b5", "expected a size"),
    ],
)
def test_cache_env_hostile_values_refused(native: Native, text: str, says: str) -> None:
    with pytest.raises(ValueError) as exc:
        plan.parse_cache(native, text, BASE)
    msg = str(exc.value)
    assert msg.startswith("$NVFP4_CPU_CACHE="), msg
    assert says in msg, msg
    assert "\n" not in msg, msg
    assert len(msg) < 400, msg


@pytest.mark.parametrize(
    ("caches", "want"),
    [
        ((32 * K, 512 * K, 32 * M), (1024, 32, 8)),  # Zen 3 (EPYC 7xx3)
        ((48 * K, 2 * M, 105 * M), (4096, 32, 8)),  # Sapphire / Emerald Rapids
        ((32 * K, 1 * M, 32 * M), (2048, 32, 8)),  # Zen 4
        ((32 * K, 256 * K, 8 * M), (512, 32, 8)),  # Skylake client
        ((32 * K, 1280 * K, 48 * M), (2560, 32, 8)),  # Ice Lake server: 1.25 MiB
        ((32 * K, 700 * K, 0), (1280, 32, 8)),  # rounded down to 16 blocks (1400 -> 1280)
        ((8 * K, 64 * K, 0), (256, 16, 4)),  # tiny: kc at its floor, kp 16, 4 tiles
        ((64 * K, 1 << 30, 1 << 30), (16384, 32, 8)),  # kc at its ceiling
    ],
)
def test_plan_derived_from_caches(
    native: Native, caches: tuple[int, int, int], want: tuple[int, int, int]
) -> None:
    assert plan.derive(native, caches) == want


def test_derive_refuses_sizes_out_of_range(native: Native) -> None:
    with pytest.raises(ValueError, match="out of range"):
        plan.derive(native, (32 * K, 1 * K, 0))


@pytest.mark.parametrize(
    "blocking",
    [(100, 32, 8), (128, 32, 8), (32768, 32, 8), (1024, 8, 8), (1024, 32, 3), (-256, 32, 4)],
)
def test_put_refuses_bad_blocking(native: Native, blocking: tuple[int, int, int]) -> None:
    before = plan.current(native)
    with pytest.raises(ValueError, match="refused"):
        plan.put(native, BASE, "given", blocking)
    assert plan.current(native) == before


def _sysfs_caches() -> dict[int, int]:
    """cpu0's data / unified cache sizes by level, read here independently of the library."""
    sizes: dict[int, int] = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        unit = {"K": K, "M": M, "G": 1 << 30}.get(size[-1], 1)
        sizes[level] = int(size.rstrip("KMG")) * unit
    return sizes


def test_detected_caches_are_sysfs(native: Native) -> None:
    sysfs = _sysfs_caches()
    caches, source = plan.detect_caches(native)
    if 1 in sysfs and 2 in sysfs:
        assert source == "sysfs"
        assert caches == (sysfs[1], sysfs[2], sysfs.get(3, 0))
    else:  # no sysfs cache directory (a container that hides it, not Linux): CPUID or defaults
        assert source in ("CPUID", "defaults")
        assert caches[0] >= 1 * K
        assert caches[1] >= 16 * K


def test_availability_states_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_CPU_CACHE", "l1d=32K,l2=512K,l3=32M")
    a = CPUBackend().availability()
    assert a.ok, a.reason
    assert (
        "plan: L1d 32K, L2 512K, L3 32M (NVFP4_CPU_CACHE); kc 1024, kp 32, 8 tiles per item"
        in a.device
    )
    monkeypatch.setenv("NVFP4_CPU_CACHE", "l2=512Q")
    a = CPUBackend().availability()
    assert not a.ok
    assert "$NVFP4_CPU_CACHE='l2=512Q'" in a.reason
    assert "\n" not in a.reason
    with pytest.raises(RuntimeError, match=r"cannot run here: \$NVFP4_CPU_CACHE="):
        CPUBackend().qmm(
            np.ones((1, 16), np.float32), nvfp4.quantize(np.ones((16, 16), np.float32))
        )
    monkeypatch.delenv("NVFP4_CPU_CACHE")
    a = CPUBackend().availability()
    assert a.ok, a.reason
    assert "NVFP4_CPU_CACHE" not in a.device
    assert "; plan: L1d " in a.device


#: (kc, kp, group): the schedule before the plan (whole K, 4 tiles) first, then slabs that
#: do and do not divide K, both panel sizes, both item sizes.
PLANS = [
    (0, 32, 4),
    (0, 16, 8),
    (256, 32, 4),
    (256, 16, 8),
    (512, 32, 8),
    (768, 16, 4),
    (1024, 32, 8),
    (4096, 32, 4),
    (16384, 16, 8),
]


def _weights(e: int | None, n: int, k: int, seed: int) -> nvfp4.NVFP4Planes:
    rng = np.random.default_rng(seed)
    shape = (n, k) if e is None else (e, n, k)
    w = rng.standard_normal(shape).astype(np.float32)
    w *= (
        np.exp2(rng.integers(-10, 4, size=(*shape[:-1], k // 16)))
        .repeat(16, axis=-1)
        .astype(np.float32)
    )
    return nvfp4.quantize(w, name=f"w{shape}")


@pytest.mark.parametrize("m", [1, 2, 5, 9, 32, 33, 70])
def test_every_plan_gives_the_same_bits(native: Native, isa: str, m: int) -> None:
    """W4A16 qmm and gather_qmm, W4A8 qmm: K = 2080 (130 blocks: slabs of 256, 512, 768
    and 1024 leave a ragged last slab), N = 88 (a ragged last tile, 6 tiles: items of 4 and 8
    split them differently), 2 threads."""
    n, k = 88, 2080
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = prepare(_weights(None, n, k, 1), native, 2)
    we = prepare(_weights(3, n, k, 2), native, 2)
    ids = rng.integers(-1, 4, size=m).astype(np.int64)  # 3 experts; -1 and 3 out of range
    outs = []
    for blocking in PLANS:
        p = plan.put(native, BASE, "given", blocking)
        assert p.blocking == blocking
        outs.append(
            (
                ops.qmm_f32(native, isa, 2, x, w),
                ops.matmul_f32(native, "nvfp4cpu_gather_qmm", isa, 2, x, we, ids),
                w4a8.qmm_w4a8(native, isa, 2, x, w),
            )
        )
    for blocking, got in zip(PLANS[1:], outs[1:], strict=True):
        for verb, a, b in zip(("qmm", "gather_qmm", "qmm_w4a8"), got, outs[0], strict=True):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (
                f"{isa} {verb} M={m}: plan {blocking} differs from {PLANS[0]}"
            )
    assert np.isfinite(outs[0][0]).all()
    assert np.abs(outs[0][0]).max() > 0
