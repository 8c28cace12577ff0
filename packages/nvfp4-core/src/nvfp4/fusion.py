"""Fused partitions (q/k/v, gate/up) and expert stacks of NVFP4 planes.

* :func:`fuse` / :func:`unfuse`: concatenate projections along N into one tensor whose
  ``partitions`` give the row boundaries, each part keeping its own decode global (shape
  ``(P,)``, or ``(E, P)`` for expert-stacked parts), and split them back. Both move no
  byte and decode every row exactly as before (a partition's global multiplies its rows).
* :func:`stack_experts` / :func:`unstack_experts`: ``E`` tensors ``[N, K]`` <-> one
  ``[E, N, K]`` tensor with globals ``(E,)`` (or ``(E, P)`` for fused experts).
* :func:`globals_differ`: how far apart the partition globals are (max / min).
* :func:`reconcile_globals`: the explicit, lossy operation that gives a fused tensor one
  global (the largest partition global) by requantizing the E4M3 block-scale bytes of the
  other partitions. It warns (:class:`ReconcileWarning`) and returns a
  :class:`ReconcileReport` of the error it introduced. Loaders never call it implicitly.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .planes import NVFP4Planes, PlaneError, validate
from .spec import E4M3_MIN_SUBNORMAL, E4M3_VALUES, e4m3_encode

__all__ = [
    "ReconcileReport",
    "ReconcileWarning",
    "fuse",
    "globals_differ",
    "partition_globals",
    "reconcile_globals",
    "stack_experts",
    "unfuse",
    "unstack_experts",
]


class ReconcileWarning(UserWarning):
    """Emitted by :func:`reconcile_globals` when it changes block-scale bytes."""


@dataclass(frozen=True)
class ReconcileReport:
    """What :func:`reconcile_globals` changed.

    Attributes:
        blocks_changed: block-scale bytes that changed.
        total_blocks: all blocks of the tensor.
        max_rel_scale_error: ``max |s' * g_max - s * g_i| / (s * g_i)`` over the blocks with
            a nonzero scale, where ``s``/``s'`` are the E4M3 values before/after and ``g_i``
            the block's partition global (0.0 when nothing changed). Every decoded element
            of a block moves by exactly this relative amount of its block.
        underflowed_blocks: nonzero blocks whose rescaled scale fell below 2^-9 (the
            smallest E4M3 value) and was clamped to 2^-9.
        max_global_ratio: :func:`globals_differ` of the input.
    """

    blocks_changed: int
    total_blocks: int
    max_rel_scale_error: float
    underflowed_blocks: int
    max_global_ratio: float


# ---------------------------------------------------------------------------- helpers
def _parts_of(p: NVFP4Planes) -> tuple[int, ...]:
    return p.partitions if p.partitions is not None else (0, p.n)


def partition_globals(planes: NVFP4Planes) -> npt.NDArray[np.float32]:
    """The global of every partition, shape ``(P,)`` or ``(E, P)`` (an unfused tensor is
    one partition), whatever shape the planes store it in."""
    e = planes.num_experts
    num = len(_parts_of(planes)) - 1
    g = planes.global_scale
    shape = (e, num) if e is not None else (num,)
    if g.ndim == 1 and e is not None and planes.partitions is None:
        g = g[:, None]  # (E,) per expert
    return np.ascontiguousarray(np.broadcast_to(g, shape), dtype=np.float32)


def _check_parts(parts: Sequence[NVFP4Planes], name: str, op: str) -> None:
    if len(parts) == 0:
        raise PlaneError(name, f"{op} parts", "at least one NVFP4Planes", "none")
    for i, p in enumerate(parts):
        if not isinstance(p, NVFP4Planes):
            raise PlaneError(name, f"{op} part {i}", "NVFP4Planes", type(p).__name__)
        validate(p)


#: How a message names each field parts must agree on.
_FIELD_LABELS = {"k": "K", "num_experts": "experts", "shape": "shape", "partitions": "partitions"}


def _check_as_part_0(name: str, where: str, p: NVFP4Planes, first: NVFP4Planes, field: str) -> None:
    """Raise :class:`~nvfp4.PlaneError` unless part ``p`` (at ``where``) has part 0's
    ``field``."""
    got, want = getattr(p, field), getattr(first, field)
    if got != want:
        raise PlaneError(
            name, f"{where} ({p.name!r}) {_FIELD_LABELS[field]}", f"{want} (as part 0)", got
        )


# ------------------------------------------------------------------------ fuse/unfuse
def fuse(parts: Sequence[NVFP4Planes], name: str) -> NVFP4Planes:
    """Concatenate projections along N into one fused tensor.

    Every part must have the same K and the same expert count (or none). The result's
    ``partitions`` are the cumulative row boundaries (an already fused part contributes its
    own partitions) and its global is every part's partition globals side by side:
    ``(P,)``, or ``(E, P)`` for expert-stacked parts. Raises :class:`~nvfp4.PlaneError`
    naming the first part that disagrees.
    """
    _check_parts(parts, name, "fuse")
    first = parts[0]
    for i, p in enumerate(parts):
        for field in ("k", "num_experts"):
            _check_as_part_0(name, f"fuse part {i}", p, first, field)
    bounds = [0]
    for p in parts:
        offset = bounds[-1]
        bounds.extend(offset + b for b in _parts_of(p)[1:])
    codes = np.concatenate([p.codes for p in parts], axis=-2)
    scales = np.concatenate([p.scales for p in parts], axis=-2)
    g = np.concatenate([partition_globals(p) for p in parts], axis=-1)
    return NVFP4Planes(codes, scales, g, partitions=tuple(bounds), name=name)


def unfuse(planes: NVFP4Planes, names: Sequence[str] | None = None) -> list[NVFP4Planes]:
    """Split a fused tensor into its partitions (views, no copy), each with its own global
    (``()`` or ``(E,)``). An unfused tensor comes back as a one-element list. ``names``
    defaults to ``"<name>.<i>"``."""
    validate(planes)
    bounds = _parts_of(planes)
    count = len(bounds) - 1
    if planes.partitions is None:
        return [planes if names is None else planes.replace(name=names[0])]
    if names is not None and len(names) != count:
        raise PlaneError(planes.name, "unfuse names", f"{count} names", len(names))
    labels = list(names) if names is not None else [f"{planes.name}.{i}" for i in range(count)]
    g = partition_globals(planes)
    return [
        NVFP4Planes(
            planes.codes[..., a:b, :],
            planes.scales[..., a:b, :],
            np.array(g[..., i], dtype=np.float32),
            name=labels[i],
        )
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]


# -------------------------------------------------------------------- expert stacking
def stack_experts(parts: Sequence[NVFP4Planes], name: str) -> NVFP4Planes:
    """Stack ``E`` tensors ``[N, K]`` into one ``[E, N, K]``.

    All parts must be 2-D with the same N, K and partitions. The global becomes ``(E,)``
    (or ``(E, P)`` for fused parts)."""
    _check_parts(parts, name, "stack_experts")
    first = parts[0]
    for i, p in enumerate(parts):
        if p.num_experts is not None:
            raise PlaneError(
                name, f"stack_experts part {i} ({p.name!r})", "a 2-D [N, K] tensor", p.shape
            )
        for field in ("shape", "partitions"):  # both 2-D here: shape is (N, K)
            _check_as_part_0(name, f"stack_experts part {i}", p, first, field)
    codes = np.stack([p.codes for p in parts])
    scales = np.stack([p.scales for p in parts])
    g = np.stack([partition_globals(p) for p in parts])  # (E, P)
    if first.partitions is None:
        g = g[:, 0]
    return NVFP4Planes(codes, scales, g, partitions=first.partitions, name=name)


def unstack_experts(planes: NVFP4Planes, names: Sequence[str] | None = None) -> list[NVFP4Planes]:
    """Split ``[E, N, K]`` into ``E`` tensors ``[N, K]`` (views), each with its expert's
    global (``()``, or ``(P,)`` for fused experts). ``names`` defaults to ``"<name>.<e>"``."""
    validate(planes)
    e = planes.num_experts
    if e is None:
        raise PlaneError(planes.name, "unstack_experts input", "[E, N, K] planes", planes.shape)
    if names is not None and len(names) != e:
        raise PlaneError(planes.name, "unstack_experts names", f"{e} names", len(names))
    labels = list(names) if names is not None else [f"{planes.name}.{i}" for i in range(e)]
    g = partition_globals(planes)  # (E, P)
    out = []
    for i in range(e):
        gi = g[i] if planes.partitions is not None else g[i, 0]
        out.append(
            NVFP4Planes(
                planes.codes[i],
                planes.scales[i],
                np.array(gi, dtype=np.float32),
                partitions=planes.partitions,
                name=labels[i],
            )
        )
    return out


# --------------------------------------------------------------------- reconciliation
def globals_differ(planes: NVFP4Planes) -> float:
    """max / min of the partition globals (per expert, the largest ratio over experts):
    1.0 when they are all equal or the tensor is not fused."""
    validate(planes, content=True)
    if planes.partitions is None or planes.global_scale.ndim == 0:
        return 1.0
    g = partition_globals(planes).astype(np.float64)
    return float(np.max(g.max(axis=-1) / g.min(axis=-1)))


def reconcile_globals(planes: NVFP4Planes) -> tuple[NVFP4Planes, ReconcileReport]:
    """Give a fused tensor one global (per expert): the largest partition global.

    Every block of partition ``i`` keeps its codes; its E4M3 scale ``s`` becomes
    ``e4m3_round(clamp(s * g_i / g_max, 2^-9, 448))`` (the quotient computed in float64,
    then rounded once to E4M3, nearest-even). A zero scale stays zero (the block decodes
    to zero either way). The result keeps the partition boundaries; its global is ``()``
    for a 2-D tensor and ``(E, P)`` with each expert's max repeated for expert-stacked ones.

    This changes the decoded values, so it emits a :class:`ReconcileWarning` whenever the
    globals differ, and returns a :class:`ReconcileReport` with the scale error introduced.
    """
    validate(planes, content=True)
    total = int(planes.scales.size)
    ratio = globals_differ(planes)
    if planes.partitions is None or planes.global_scale.ndim == 0:
        return planes, ReconcileReport(0, total, 0.0, 0, 1.0)
    g = partition_globals(planes)  # (P,) or (E, P)
    g_max = g.max(axis=-1, keepdims=True)
    new_global = np.broadcast_to(g_max, g.shape) if planes.num_experts is not None else g_max[0]
    new_global = np.array(new_global, dtype=np.float32)
    if ratio == 1.0:
        return planes.replace(global_scale=new_global), ReconcileReport(0, total, 0.0, 0, 1.0)

    sizes = [b - a for a, b in itertools.pairwise(planes.partitions)]
    row_gi = np.repeat(g.astype(np.float64), sizes, axis=-1)[..., None]  # [E?, N, 1]
    row_gmax = np.repeat(np.broadcast_to(g_max, g.shape).astype(np.float64), sizes, axis=-1)[
        ..., None
    ]
    s = E4M3_VALUES[planes.scales].astype(np.float64)  # [E?, N, K/16]
    target = s * row_gi / row_gmax  # s * g_i exact in float64, then one rounding
    nonzero = planes.scales != 0
    under = nonzero & (target < E4M3_MIN_SUBNORMAL)
    new_bytes = np.where(nonzero, e4m3_encode(target)[0], np.uint8(0))
    new_bytes = new_bytes.astype(np.uint8)

    s_new = E4M3_VALUES[new_bytes].astype(np.float64)
    ref = s * row_gi
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(nonzero, np.abs(s_new * row_gmax - ref) / ref, 0.0)
    report = ReconcileReport(
        blocks_changed=int(np.count_nonzero(new_bytes != planes.scales)),
        total_blocks=total,
        max_rel_scale_error=float(rel.max()) if rel.size else 0.0,
        underflowed_blocks=int(np.count_nonzero(under)),
        max_global_ratio=ratio,
    )
    warnings.warn(
        f"nvfp4: reconcile_globals({planes.name!r}) requantized block scales to one global "
        f"(partition globals differed by {ratio:.6g}x): {report.blocks_changed} of "
        f"{total} blocks changed, max relative scale error {report.max_rel_scale_error:.3g}, "
        f"{report.underflowed_blocks} blocks clamped to 2^-9",
        ReconcileWarning,
        stacklevel=2,
    )
    return planes.replace(scales=new_bytes, global_scale=new_global), report
