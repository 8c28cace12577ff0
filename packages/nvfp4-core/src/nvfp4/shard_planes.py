"""Cut NVFP4 planes into per-rank shards by a :mod:`nvfp4.shard_plan` plan, and put them
back together (spec 1.2, section "Sharding for tensor and expert parallelism").

* ``"n"`` plans (column-parallel) keep rows ``[start, stop)``; ``"k"`` plans (row-parallel)
  keep K columns ``[start, stop)`` -- codes at ``start / 2``, scales at ``start / 16``, so a
  shard's bytes and its scales always come from the same blocks; ``"experts"`` plans keep
  experts ``[start, stop)`` with their globals.
* A rank whose padded size exceeds its range gets zero padding at the end: codes 0 (E2M1
  +0.0) and scale bytes 0x00 (E4M3 0.0), so every padded element decodes to exactly 0.0
  and a padded block adds exactly 0 to any product. A fused tensor is never cut as one
  row range (:func:`shard_fused`).
* Without padding a shard is a view of the source (no copy).
* Fused tensors (q/k/v, gate/up; :mod:`nvfp4.fused_plan`): :func:`shard_fused` splits
  every partition by its own plan, pads it by that plan (each partition's padded rows at
  the end of its piece), and concatenates a rank's pieces in partition order, keeping every
  partition's global (or the one they share); :func:`reassemble_fused` is its inverse,
  :func:`shard_fused_swizzled_scales` the same for 128x4 swizzled scales.
* Swizzled 128x4 scale buffers are never cut directly (a tile holds 128 rows x 4 blocks):
  :func:`shard_swizzled_scales` unswizzles, cuts the linear scales, and swizzles each
  shard again (its own tile padding, 0x00).

:func:`reassemble` is the inverse: it drops the padding (after checking it is zero) and
gives back the source's bytes exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .fused_plan import FusedPlan, as_fused_plan
from .layouts.swizzle import swizzle_scales, unswizzle_scales
from .planes import NVFP4Planes, PlaneError, validate
from .shard_plan import ShardPlan, ShardRange
from .sharding import slice_k, slice_rows
from .spec import BLOCK_SIZE

__all__ = [
    "check_padding",
    "pad_fused",
    "pad_shard",
    "reassemble",
    "reassemble_fused",
    "reassemble_fused_swizzled_scales",
    "reassemble_swizzled_scales",
    "shard_fused",
    "shard_fused_swizzled_scales",
    "shard_planes",
    "shard_swizzled_scales",
]


def _pad(a: npt.NDArray[np.uint8], axis: int, extra: int) -> npt.NDArray[np.uint8]:
    """``a`` with ``extra`` zero bytes appended along ``axis`` (a copy)."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return np.pad(a, widths, mode="constant", constant_values=0)


def _require_size(planes: NVFP4Planes, dim: str, expected: int, what: str) -> None:
    """Raise :class:`PlaneError` (naming ``what``) unless ``planes`` hold ``expected``
    rows (``"n"``), K values (``"k"``) or experts (``"experts"``) along ``dim``."""
    have = {"n": planes.n, "k": planes.k, "experts": planes.num_experts}.get(dim)
    if have != expected:
        raise PlaneError(planes.name, what, expected, "no expert axis" if have is None else have)


def _check_plan(planes: NVFP4Planes, plan: ShardPlan) -> None:
    if plan.dim == "heads":
        raise PlaneError(
            planes.name, "shard plan", "an 'n', 'k' or 'experts' plan (scale a head plan)", "heads"
        )
    _require_size(planes, plan.dim, plan.size, f"{plan.dim} size for plan {plan.name!r}")
    _refuse_one_row_range(planes, plan)


def _refuse_one_row_range(planes: NVFP4Planes, plan: ShardPlan) -> None:
    """A fused tensor (two partitions or more) is never split as one range of rows."""
    if plan.dim == "n" and planes.partitions is not None and len(planes.partitions) > 2:
        raise PlaneError(
            planes.name,
            f"rows of a fused tensor (partitions {planes.partitions}) split by one plan "
            f"{plan.name!r}",
            "one plan a partition (shard_fused / pad_fused): a fused tensor is never split "
            "as one range of rows",
            "one 'n' plan",
        )


def pad_shard(piece: NVFP4Planes, plan: ShardPlan, rank: int) -> NVFP4Planes:
    """``rank``'s shard from ``piece``, the rank's logical range alone (``plan[rank].size``
    rows of an ``"n"`` plan, K columns of a ``"k"`` plan), with the rank's zero padding
    appended (codes 0, scale bytes 0x00): what :func:`shard_planes` returns (a fused
    tensor's piece: :func:`pad_fused`). For a loader that reads only the range from a file
    (nvfp4-checkpoints' rank loading), so both pad by this one rule. An ``"experts"`` plan
    has no padding: the piece is returned as it is.

    Raises:
        PlaneError: a piece whose size along the plan's dimension is not the range's.
    """
    validate(piece)
    r = plan[rank]
    _require_size(
        piece, plan.dim, r.size, f"rank {rank} {plan.dim} size before padding (plan {plan.name!r})"
    )
    _refuse_one_row_range(piece, plan)
    if not r.padding or plan.dim == "experts":
        return piece
    if plan.dim == "n":
        parts = piece.partitions  # None, or one partition: it takes the padded rows
        return NVFP4Planes(
            _pad(piece.codes, -2, r.padding),
            _pad(piece.scales, -2, r.padding),
            piece.global_scale,
            partitions=None if parts is None else (0, parts[-1] + r.padding),
            name=piece.name,
        )
    return NVFP4Planes(
        _pad(piece.codes, -1, r.padding // 2),
        _pad(piece.scales, -1, r.padding // BLOCK_SIZE),
        piece.global_scale,
        partitions=piece.partitions,
        name=piece.name,
    )


def _experts(planes: NVFP4Planes, r: ShardRange) -> NVFP4Planes:
    g = planes.global_scale
    return NVFP4Planes(
        planes.codes[r.start : r.stop],
        planes.scales[r.start : r.stop],
        g if g.ndim == 0 else g[r.start : r.stop],
        partitions=planes.partitions,
        name=planes.name,
    )


def shard_planes(planes: NVFP4Planes, plan: ShardPlan, rank: int) -> NVFP4Planes:
    """``rank``'s shard of ``planes`` by ``plan`` (``"n"``, ``"k"`` or ``"experts"``),
    zero-padded to the rank's padded size; a view when there is no padding.

    Raises:
        PlaneError: a plan whose size is not the tensor's, a bad rank, a head plan.
    """
    validate(planes)
    _check_plan(planes, plan)
    r = plan[rank]
    if plan.dim == "n":
        return pad_shard(slice_rows(planes, r.start, r.stop), plan, rank)
    if plan.dim == "k":
        return pad_shard(slice_k(planes, r.start, r.stop), plan, rank)
    return _experts(planes, r)


def shard_fused(
    planes: NVFP4Planes, plans: FusedPlan | Sequence[ShardPlan], rank: int
) -> NVFP4Planes:
    """``rank``'s shard of a fused tensor (q/k/v, gate/up; :mod:`nvfp4.fused_plan`):
    partition ``i`` cut by ``plans[i]`` (an ``"n"`` plan of its rows) and padded by that
    plan, the pieces concatenated in partition order. Partition bounds recorded in the
    planes must be the plan's; the rank's piece then records its own
    (:meth:`~nvfp4.fused_plan.FusedPlan.rank_bounds`) and keeps every partition's global.
    A fused tensor whose partitions share one global and record no bounds (ModelOpt's
    fused layers) is cut by the plan's bounds and keeps its one global, unpartitioned.

    Raises:
        PlaneError: N or the recorded bounds not the plan's, a bad rank, naming the tensor
            and the partition.
    """
    validate(planes)
    fp = _fused_for(planes, plans)
    fp.parts[0][rank]  # the rank checked once, named by the plan
    return _rows_to_planes(
        planes,
        _cut_rows(planes.codes, fp, rank),
        _cut_rows(planes.scales, fp, rank),
        fp.rank_bounds(rank),
    )


def pad_fused(piece: NVFP4Planes, plans: FusedPlan | Sequence[ShardPlan], rank: int) -> NVFP4Planes:
    """``rank``'s shard of a fused tensor from ``piece``, the rank's logical rows of every
    partition concatenated (no padding; its bounds, when recorded, the plan's
    :meth:`~nvfp4.fused_plan.FusedPlan.logical_bounds`): every partition's zero padding
    inserted after its rows, as :func:`shard_fused` gives it. For a loader that reads only
    the rank's rows of each partition (nvfp4-checkpoints' rank loading).

    Raises:
        PlaneError: a piece whose rows or bounds are not the rank's, naming the partition.
    """
    validate(piece)
    fp = as_fused_plan(plans, piece.name)
    logical = fp.logical_bounds(rank)
    if piece.n != logical[-1]:
        raise PlaneError(
            piece.name,
            f"rank {rank} rows before padding (fused, {len(fp)} partitions)",
            f"{logical[-1]} = {' + '.join(str(p[rank].size) for p in fp)}",
            piece.n,
        )
    _require_bounds(piece, logical, f"rank {rank} partition bounds before padding")

    def pad(a: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        pieces = [
            _pad(a[..., lo:hi, :], -2, part[rank].padding)
            for part, (lo, hi) in zip(fp, itertools.pairwise(logical), strict=True)
        ]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=-2)

    return _rows_to_planes(piece, pad(piece.codes), pad(piece.scales), fp.rank_bounds(rank))


def _fused_for(planes: NVFP4Planes, plans: FusedPlan | Sequence[ShardPlan]) -> FusedPlan:
    """The fused plan, checked against the whole tensor's N and recorded bounds."""
    fp = as_fused_plan(plans, planes.name)
    if planes.n != fp.size:
        raise PlaneError(
            planes.name,
            f"N of the fused tensor (partitions {', '.join(fp.labels)})",
            f"{fp.size} = {' + '.join(str(p.size) for p in fp)} by the plan",
            planes.n,
        )
    _require_bounds(planes, fp.bounds, "partition bounds")
    return fp


def _require_bounds(planes: NVFP4Planes, bounds: tuple[int, ...], what: str) -> None:
    if planes.partitions is not None and planes.partitions != bounds:
        raise PlaneError(planes.name, what, f"{bounds} by the fused plan", planes.partitions)


def _cut_rows(a: npt.NDArray[np.uint8], fp: FusedPlan, rank: int) -> npt.NDArray[np.uint8]:
    """Rows of every partition's range of ``rank`` (``a``'s rows on axis -2), each padded
    with zero rows by its plan, concatenated in partition order."""
    pieces = []
    for part, lo in zip(fp, fp.bounds, strict=False):
        r = part[rank]
        pieces.append(_pad(a[..., lo + r.start : lo + r.stop, :], -2, r.padding))
    return np.concatenate(pieces, axis=-2)


def _rows_to_planes(
    like: NVFP4Planes,
    codes: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.uint8],
    bounds: tuple[int, ...],
) -> NVFP4Planes:
    """Planes of ``codes`` / ``scales`` with ``like``'s globals; partitioned by ``bounds``
    when ``like`` records partitions (every rank holds every partition)."""
    parts = None if like.partitions is None else bounds
    return NVFP4Planes(codes, scales, like.global_scale, partitions=parts, name=like.name)


def _join_rows(
    pieces: Sequence[npt.NDArray[np.uint8]], fp: FusedPlan, name: str, what: str
) -> npt.NDArray[np.uint8]:
    """Inverse of :func:`_cut_rows` over every rank's piece: each partition's rows put
    back at their ranges, padding checked to be zero, rows held by several ranks (KV heads
    replicated) checked to be equal, every row checked to be held."""
    out_parts = []
    for i, (label, part) in enumerate(zip(fp.labels, fp, strict=True)):
        first = pieces[0]
        out = np.zeros((*first.shape[:-2], part.size, first.shape[-1]), dtype=np.uint8)
        held = np.zeros(part.size, dtype=bool)
        for rank, piece in enumerate(pieces):
            r, lo = part[rank], fp.rank_bounds(rank)[i]
            rows, tail = piece[..., lo : lo + r.size, :], piece[..., lo + r.size : lo + r.padded, :]
            bad = np.argwhere(tail != 0)
            if bad.size:
                raise PlaneError(
                    name,
                    f"rank {rank} partition {label} padded {what} (plan {part.name!r})",
                    "0x00",
                    f"0x{int(tail[tuple(bad[0])]):02X} at padded index {tuple(int(j) for j in bad[0])}",
                )
            again = held[r.start : r.stop]
            if np.any(again) and not np.array_equal(
                out[..., r.start : r.stop, :][..., again, :], rows[..., again, :]
            ):
                raise PlaneError(
                    name,
                    f"rank {rank} partition {label} {what} of rows held by another rank too",
                    "the same bytes (replicated rows)",
                    "other bytes",
                )
            out[..., r.start : r.stop, :] = rows
            held[r.start : r.stop] = True
        if not held.all():
            raise PlaneError(
                name,
                f"partition {label} rows held by the ranks",
                f"all {part.size}",
                f"row {int(np.argmin(held))} held by none",
            )
        out_parts.append(out)
    return np.concatenate(out_parts, axis=-2)


def check_padding(shard: NVFP4Planes, plan: ShardPlan, rank: int) -> None:
    """Raise :class:`~nvfp4.PlaneError` unless ``rank``'s padding (if any) is all zero
    codes and 0x00 scale bytes, naming the first nonzero byte."""
    r = plan[rank]
    if plan.dim == "experts" or not r.padding:
        return
    if plan.dim == "n":
        tails = (
            ("codes", shard.codes[..., r.size :, :]),
            ("scales", shard.scales[..., r.size :, :]),
        )
    else:
        tails = (
            ("codes", shard.codes[..., r.size // 2 :]),
            ("scales", shard.scales[..., r.size // BLOCK_SIZE :]),
        )
    for what, tail in tails:
        bad = np.argwhere(tail != 0)
        if bad.size:
            raise PlaneError(
                shard.name,
                f"rank {rank} padding {what} (plan {plan.name!r}, dim {plan.dim})",
                "0x00",
                f"0x{int(tail[tuple(bad[0])]):02X} at padded index {tuple(int(i) for i in bad[0])}",
            )


def _unpad(shard: NVFP4Planes, plan: ShardPlan, rank: int) -> NVFP4Planes:
    r = plan[rank]
    want = r.padded if plan.dim != "experts" else r.size
    have = {"n": shard.n, "k": shard.k, "experts": shard.num_experts}[plan.dim]
    if have != want:
        raise PlaneError(shard.name, f"rank {rank} shard {plan.dim} size", want, have)
    check_padding(shard, plan, rank)
    if not r.padding or plan.dim == "experts":
        return shard
    if plan.dim == "n":
        parts = shard.partitions
        if parts is not None:
            parts = (*parts[:-1], parts[-1] - r.padding)
        return NVFP4Planes(
            shard.codes[..., : r.size, :],
            shard.scales[..., : r.size, :],
            shard.global_scale,
            partitions=parts,
            name=shard.name,
        )
    return slice_k(shard, 0, r.size)


def reassemble(shards: Sequence[NVFP4Planes], plan: ShardPlan) -> NVFP4Planes:
    """The source tensor from its shards: padding checked to be zero and dropped, the
    logical ranges concatenated. The result's bytes equal the source's exactly."""
    if len(shards) != plan.world:
        raise PlaneError(plan.name, "shards", f"{plan.world} (one a rank)", len(shards))
    parts = [_unpad(s, plan, rank) for rank, s in enumerate(shards)]
    first = parts[0]
    if plan.dim == "n":
        if any(p.partitions is not None for p in parts):
            raise PlaneError(
                first.name,
                "row shards to reassemble",
                "unfused shards (fused ones: shard_fused / reassemble_fused)",
                "partitioned shards",
            )
        return NVFP4Planes(
            np.concatenate([p.codes for p in parts], axis=-2),
            np.concatenate([p.scales for p in parts], axis=-2),
            first.global_scale,
            name=first.name,
        )
    if plan.dim == "k":
        return NVFP4Planes(
            np.concatenate([p.codes for p in parts], axis=-1),
            np.concatenate([p.scales for p in parts], axis=-1),
            first.global_scale,
            partitions=first.partitions,
            name=first.name,
        )
    g = first.global_scale
    return NVFP4Planes(
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.scales for p in parts]),
        g if g.ndim == 0 else np.concatenate([p.global_scale for p in parts]),
        partitions=first.partitions,
        name=first.name,
    )


def reassemble_fused(
    shards: Sequence[NVFP4Planes],
    plans: FusedPlan | Sequence[ShardPlan],
    name: str | None = None,
) -> NVFP4Planes:
    """Inverse of :func:`shard_fused`: every partition put back from every rank's piece
    (padding checked to be zero and dropped; KV rows replicated over ranks checked to be
    equal), the partitions concatenated. The result's bytes equal the source's exactly.

    Raises:
        PlaneError: a wrong number of shards, a shard whose rows, bounds or globals are not
            the rank's, nonzero padding, replicated rows that differ (naming the rank and
            the partition).
    """
    label = name or (shards[0].name if shards else "fused")
    fp = as_fused_plan(plans, label)
    if len(shards) != fp.world:
        raise PlaneError(label, "fused shards", f"{fp.world} (one a rank)", len(shards))
    first = shards[0]
    for rank, s in enumerate(shards):
        validate(s)
        if s.n != fp.padded(rank):
            raise PlaneError(s.name, f"rank {rank} fused rows (padded)", fp.padded(rank), s.n)
        _require_bounds(s, fp.rank_bounds(rank), f"rank {rank} partition bounds")
        if (s.partitions is None) != (first.partitions is None):
            raise PlaneError(s.name, f"rank {rank} partitions", "as rank 0's", s.partitions)
        g, g0 = s.global_scale, first.global_scale
        if g.shape != g0.shape or g.tobytes() != g0.tobytes():
            raise PlaneError(s.name, f"rank {rank} globals", f"rank 0's {g0.tolist()}", g.tolist())
    codes = _join_rows([s.codes for s in shards], fp, label, "codes")
    scales = _join_rows([s.scales for s in shards], fp, label, "scale bytes")
    parts = None if first.partitions is None else fp.bounds
    return NVFP4Planes(codes, scales, first.global_scale, partitions=parts, name=label)


def shard_swizzled_scales(
    buf: Any, n: int, k_blocks: int, plan: ShardPlan, rank: int, *, name: str = "scales"
) -> npt.NDArray[np.uint8]:
    """``rank``'s 128x4-swizzled scale buffer, cut from the whole tensor's swizzled buffer
    ``buf`` (``[size]`` or ``[E, size]``) of linear shape ``[n, k_blocks]``: unswizzle,
    cut the rows (``"n"`` plan) or the blocks (``"k"`` plan) with zero padding, swizzle the
    shard (its tile padding 0x00)."""
    linear = unswizzle_scales(buf, n, k_blocks, name)
    r = plan[rank]
    if plan.dim == "n":
        if plan.size != n:
            raise PlaneError(name, f"N for plan {plan.name!r}", plan.size, n)
        part = _pad(linear[..., r.start : r.stop, :], -2, r.padding)
    elif plan.dim == "k":
        if plan.size != k_blocks * BLOCK_SIZE:
            raise PlaneError(name, f"K for plan {plan.name!r}", plan.size, k_blocks * BLOCK_SIZE)
        a, b = r.start // BLOCK_SIZE, r.stop // BLOCK_SIZE
        part = _pad(linear[..., a:b], -1, r.padding // BLOCK_SIZE)
    else:
        raise PlaneError(name, "swizzled scale plan", "an 'n' or 'k' plan", plan.dim)
    return swizzle_scales(np.ascontiguousarray(part), name)


def reassemble_swizzled_scales(
    bufs: Sequence[Any], n: int, k_blocks: int, plan: ShardPlan, *, name: str = "scales"
) -> npt.NDArray[np.uint8]:
    """The whole tensor's swizzled scale buffer from the ranks' swizzled buffers (inverse
    of :func:`shard_swizzled_scales`; padding must be 0x00)."""
    if len(bufs) != plan.world:
        raise PlaneError(name, "swizzled shards", f"{plan.world} (one a rank)", len(bufs))
    pieces = []
    for rank, b in enumerate(bufs):
        r = plan[rank]
        if plan.dim == "n":
            lin = unswizzle_scales(b, r.padded, k_blocks, name)
            tail, keep = lin[..., r.size :, :], lin[..., : r.size, :]
        elif plan.dim == "k":
            lin = unswizzle_scales(b, n, r.padded // BLOCK_SIZE, name)
            tail, keep = lin[..., r.size // BLOCK_SIZE :], lin[..., : r.size // BLOCK_SIZE]
        else:
            raise PlaneError(name, "swizzled scale plan", "an 'n' or 'k' plan", plan.dim)
        if np.any(tail != 0):
            raise PlaneError(name, f"rank {rank} padded scale bytes", "0x00", "a nonzero byte")
        pieces.append(keep)
    linear = np.concatenate(pieces, axis=-2 if plan.dim == "n" else -1)
    return swizzle_scales(linear, name)


def shard_fused_swizzled_scales(
    buf: Any,
    n: int,
    k_blocks: int,
    plans: FusedPlan | Sequence[ShardPlan],
    rank: int,
    *,
    name: str = "scales",
) -> npt.NDArray[np.uint8]:
    """``rank``'s 128x4-swizzled scale buffer of a fused tensor, cut from the whole
    tensor's swizzled buffer ``buf`` (linear shape ``[n, k_blocks]``): unswizzle, cut every
    partition's rows by its plan with zero padding (as :func:`shard_fused`), swizzle the
    rank's rows (its own tile padding, 0x00)."""
    fp = as_fused_plan(plans, name)
    if fp.size != n:
        raise PlaneError(
            name, f"N of the fused tensor (partitions {', '.join(fp.labels)})", fp.size, n
        )
    _ = fp.parts[0][rank]  # a bad rank refused here, named by the plan
    linear = unswizzle_scales(buf, n, k_blocks, name)
    return swizzle_scales(np.ascontiguousarray(_cut_rows(linear, fp, rank)), name)


def reassemble_fused_swizzled_scales(
    bufs: Sequence[Any],
    k_blocks: int,
    plans: FusedPlan | Sequence[ShardPlan],
    *,
    name: str = "scales",
) -> npt.NDArray[np.uint8]:
    """The whole fused tensor's swizzled scale buffer from the ranks' swizzled buffers
    (inverse of :func:`shard_fused_swizzled_scales`; padding must be 0x00, replicated rows
    equal)."""
    fp = as_fused_plan(plans, name)
    if len(bufs) != fp.world:
        raise PlaneError(name, "swizzled fused shards", f"{fp.world} (one a rank)", len(bufs))
    linear = [unswizzle_scales(b, fp.padded(rank), k_blocks, name) for rank, b in enumerate(bufs)]
    return swizzle_scales(_join_rows(linear, fp, name, "scale bytes"), name)
