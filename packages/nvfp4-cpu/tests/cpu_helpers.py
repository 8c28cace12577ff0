"""Helpers shared by the nvfp4-cpu tests: the spec's error measure against its tolerance,
with every error measured kept for the end-of-run summary; the levels that must equal the
portable level bit for bit, and the count of calls compared so (see conftest.py); the test
weights of the W4A16 and W4A8 tests, and their check of a gather kernel."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import nvfp4
from nvfp4 import reference
from nvfp4.contract import VERBS
from nvfp4.hardware import cpuinfo
from nvfp4.testing import assert_within
from nvfp4.tolerances import tolerance

MEASURED: dict[str, list[float]] = defaultdict(list)

#: Levels whose kernels do the portable level's float32 operations in its order (no FMA:
#: csrc/kernels_neon.c), so every output equals the portable level's bit for bit. The x86
#: levels fuse multiply-adds and are held to the spec tolerances only.
BIT_IDENTICAL_TO_PORTABLE = ("neon",)
#: Kernel calls of those levels compared with the portable level, by "level/verb".
CROSS_CHECKED: Counter[str] = Counter()


def cpuinfo_field(name: str) -> str:
    """Field ``name`` of the first processor in /proc/cpuinfo (``"flags"``, ``"vendor_id"``,
    ...), read independently of the library; ``""`` where there is no such file or field."""
    return cpuinfo().get(name, "")


def cpuinfo_flags() -> set[str]:
    """The x86 feature flags of /proc/cpuinfo (empty where there are none)."""
    return set(cpuinfo_field("flags").split())


def check_close(path: str, dtype: str, y: np.ndarray, ref: np.ndarray, label: str = "") -> float:
    """Assert ``y`` is within ``tolerance(path, dtype)`` of ``ref`` (``nvfp4.testing``'s
    measure) and record the error."""
    figs = assert_within(y, ref, tolerance(path, dtype), f"{path} {dtype} {label}")
    MEASURED[f"{path}/{dtype}"].append(figs["max_rel_err"])
    return float(figs["max_rel_err"])


_WEIGHTS: dict[tuple[int, int], nvfp4.NVFP4Planes] = {}


def heavy_tailed_weight(n: int, k: int) -> nvfp4.NVFP4Planes:
    """Random weights ``[n, k]`` with heavy-tailed rows, so block scales span many E4M3
    bytes (made once per shape)."""
    if (n, k) not in _WEIGHTS:
        rng = np.random.default_rng(1000 * n + k)
        w = rng.standard_normal((n, k)).astype(np.float32)
        w *= np.exp2(rng.integers(-12, 4, size=(n, k // 16))).repeat(16, axis=1).astype(np.float32)
        _WEIGHTS[n, k] = nvfp4.quantize(w, name=f"w{n}x{k}")
    return _WEIGHTS[n, k]


def expert_stack(e: int, n: int, k: int, seed: int, **kw: object) -> nvfp4.NVFP4Planes:
    """Random experts ``[e, n, k]`` whose globals lie far apart (``kw``: ``partitions``)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((e, n, k)).astype(np.float32)
    w *= np.exp2(np.arange(e, dtype=np.float32) * 3 - 6)[:, None, None]  # very different globals
    return nvfp4.quantize(w, name="experts", **kw)  # type: ignore[arg-type]


def check_gather(
    verb: str, isa: str, p: nvfp4.NVFP4Planes, x: np.ndarray, ids: np.ndarray, sort: bool
) -> np.ndarray:
    """Run the gather kernel ``verb`` at level ``isa`` (2 threads) and hold it to the
    reference: the shape, rows of out-of-range ids exactly +0, each expert's rows (on their
    own scale) within the float32 tolerance of the capability certifying the verb. Returns
    the result."""
    from nvfp4_cpu import CPUBackend

    b = CPUBackend(isa=isa, threads=2)
    y = getattr(b, verb)(x, b.prepare(p), ids, sorted_indices=sort)
    assert y.shape == (x.shape[0], p.n)
    ref = getattr(reference, verb)(x, p, ids, sorted_indices=sort, out_dtype=None)
    valid = (ids >= 0) & (ids < p.num_experts)
    # rows of out-of-range ids are exactly zero (and not part of the tolerance)
    assert (y[~valid] == 0).all()
    assert not np.signbit(y[~valid]).any()
    for e in np.unique(ids[valid]):  # each expert's rows on their own scale
        rows = ids == e
        check_close(VERBS[verb].capability, "float32", y[rows], ref[rows], f"{isa} expert {e}")
    return y
