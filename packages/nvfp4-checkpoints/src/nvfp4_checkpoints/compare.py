"""The one comparison of two checkpoints, tensor by tensor: what ``nvfp4 verify`` reports
and what ``nvfp4 convert`` (:func:`~nvfp4_checkpoints.write_checkpoint`) checks its output
against before the output is renamed into place.

NVFP4 tensors compare their codes and scale bytes exactly and their globals and input
scales within a number of float32 ulps (default: 1 when either side is compressed-tensors,
whose global is a float32 reciprocal, else 0); other tensors compare their values (both
widened to float64 where the dtypes differ, as GGUF widens 1-D bf16 / f16). One tensor is
held at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes

from .checkpoint import Checkpoint

__all__ = ["compare", "compare_planes", "first_diff", "ulps_apart"]


def first_diff(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> str | None:
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    neq = a != b
    if not neq.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(neq)[0])
    return f"at {idx}: {a[idx]!r} vs {b[idx]!r} ({int(neq.sum())} differ)"


def ulps_apart(x: float, y: float) -> int:
    a = np.asarray([x, y], dtype=np.float32).view(np.int32).astype(np.int64)
    return int(abs(a[0] - a[1]))


def compare_planes(
    name: str, pa: NVFP4Planes, pb: NVFP4Planes, ulp_ok: int
) -> tuple[str | None, int]:
    for what, x, y in (("codes", pa.codes, pb.codes), ("scale bytes", pa.scales, pb.scales)):
        d = first_diff(np.asarray(x), np.asarray(y))
        if d:
            return f"tensor {name!r}: {what} differ {d}", 0
    ga = np.asarray(pa.global_scale, dtype=np.float32).reshape(-1)
    gb = np.asarray(pb.global_scale, dtype=np.float32).reshape(-1)
    if ga.shape != gb.shape:
        return (
            f"tensor {name!r}: global shape {pa.global_scale.shape} vs {pb.global_scale.shape}",
            0,
        )
    worst = max((ulps_apart(float(x), float(y)) for x, y in zip(ga, gb, strict=True)), default=0)
    if worst > ulp_ok:
        return (
            f"tensor {name!r}: global {ga.tolist()} vs {gb.tolist()} ({worst} ulp apart, "
            f"{ulp_ok} allowed)"
        ), worst
    if pa.partitions != pb.partitions:
        return f"tensor {name!r}: partitions {pa.partitions} vs {pb.partitions}", 0
    return None, worst


def compare(
    a: Checkpoint, b: Checkpoint, ulps: int | None = None
) -> tuple[str | None, dict[str, int]]:
    """The first difference beyond ``ulps`` (``None``: none), and what was compared: counts
    of NVFP4 tensors, of globals and input scales within ``ulps`` but not bit-identical
    (with the most ulps seen), and of other tensors."""
    ulp_ok = ulps if ulps is not None else int("compressed-tensors" in (a.flavour, b.flavour))
    qa, qb = a.quantized_names(), set(b.quantized_names())
    for n in qa:
        if n not in qb:
            return f"NVFP4 tensor {n!r} is in A but not in B", {}
    for n in b.quantized_names():
        if n not in set(qa):
            return f"NVFP4 tensor {n!r} is in B but not in A", {}
    stats = dict.fromkeys(
        ("nvfp4", "globals_apart", "global_ulps", "inputs_apart", "input_ulps", "other"), 0
    )
    stats["ulp_ok"] = ulp_ok
    for n in qa:
        diff, ulps = compare_planes(n, a.planes(n), b.planes(n), ulp_ok)
        if diff:
            return diff, stats
        ia, ib = a.input_scale(n), b.input_scale(n)
        if (ia is None) != (ib is None):
            return f"tensor {n!r}: input_scale {ia} vs {ib}", stats
        input_ulps = ulps_apart(ia, ib) if ia is not None and ib is not None else 0
        if input_ulps > ulp_ok:
            return (
                f"tensor {n!r}: input_scale {ia!r} vs {ib!r} ({input_ulps} ulp apart, {ulp_ok} allowed)",
                stats,
            )
        stats["nvfp4"] += 1
        stats["globals_apart"] += int(ulps > 0)
        stats["global_ulps"] = max(stats["global_ulps"], ulps)
        stats["inputs_apart"] += int(input_ulps > 0)
        stats["input_ulps"] = max(stats["input_ulps"], input_ulps)
    ta, tb = a.tensor_names(), set(b.tensor_names())
    for n in ta:
        if n not in tb:
            return f"tensor {n!r} is in A but not in B", stats
    for n in b.tensor_names():
        if n not in set(ta):
            return f"tensor {n!r} is in B but not in A", stats
    for n in ta:
        x, y = np.asarray(a.tensor(n)), np.asarray(b.tensor(n))
        if x.dtype != y.dtype:
            x, y = x.astype(np.float64), y.astype(np.float64)
        d = first_diff(x, y)
        if d:
            return f"tensor {n!r}: values differ {d}", stats
        stats["other"] += 1
    return None, stats
