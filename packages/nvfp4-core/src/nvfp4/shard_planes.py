"""Cut NVFP4 planes into per-rank shards by a :mod:`nvfp4.shard_plan` plan, and put them
back together (spec 1.2 draft, section "Sharding").

* ``"n"`` plans (column-parallel) keep rows ``[start, stop)``; ``"k"`` plans (row-parallel)
  keep K columns ``[start, stop)`` -- codes at ``start / 2``, scales at ``start / 16``, so a
  shard's bytes and its scales always come from the same blocks; ``"experts"`` plans keep
  experts ``[start, stop)`` with their globals.
* A rank whose padded size exceeds its range gets zero padding at the end: codes 0 (E2M1
  +0.0) and scale bytes 0x00 (E4M3 0.0), so every padded element decodes to exactly 0.0
  and a padded block adds exactly 0 to any product. Padded rows belong to the last
  partition of a fused tensor.
* Without padding a shard is a view of the source (no copy).
* Fused tensors (q/k/v, gate/up): :func:`shard_fused` splits every partition by its own
  plan and concatenates a rank's pieces, each keeping its partition's global.
* Swizzled 128x4 scale buffers are never cut directly (a tile holds 128 rows x 4 blocks):
  :func:`shard_swizzled_scales` unswizzles, cuts the linear scales, and swizzles each
  shard again (its own tile padding, 0x00).

:func:`reassemble` is the inverse: it drops the padding (after checking it is zero) and
gives back the source's bytes exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .fusion import fuse, unfuse
from .layouts.swizzle import swizzle_scales, unswizzle_scales
from .planes import NVFP4Planes, PlaneError, validate
from .shard_plan import ShardPlan, ShardRange
from .sharding import slice_k, slice_rows
from .spec import BLOCK_SIZE

__all__ = [
    "check_padding",
    "pad_shard",
    "reassemble",
    "reassemble_fused",
    "reassemble_swizzled_scales",
    "shard_fused",
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


def pad_shard(piece: NVFP4Planes, plan: ShardPlan, rank: int) -> NVFP4Planes:
    """``rank``'s shard from ``piece``, the rank's logical range alone (``plan[rank].size``
    rows of an ``"n"`` plan, K columns of a ``"k"`` plan), with the rank's zero padding
    appended (codes 0, scale bytes 0x00; padded rows join the last partition): what
    :func:`shard_planes` returns. For a loader that reads only the range from a file
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
    if not r.padding or plan.dim == "experts":
        return piece
    if plan.dim == "n":
        parts = piece.partitions
        if parts is not None:  # the padding joins the last partition
            parts = (*parts[:-1], parts[-1] + r.padding)
        return NVFP4Planes(
            _pad(piece.codes, -2, r.padding),
            _pad(piece.scales, -2, r.padding),
            piece.global_scale,
            partitions=parts,
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


def shard_fused(planes: NVFP4Planes, plans: Sequence[ShardPlan], rank: int) -> NVFP4Planes:
    """``rank``'s shard of a fused tensor: partition ``i`` cut by ``plans[i]`` (an ``"n"``
    plan of that partition's rows), the pieces fused again in partition order, each with
    its own global. q/k/v takes the head plan's rows, gate/up the down projection's K plan
    for both."""
    validate(planes)
    parts = unfuse(planes)
    if len(plans) != len(parts):
        raise PlaneError(
            planes.name, "fused shard plans", f"{len(parts)} (one a partition)", len(plans)
        )
    pieces = []
    for part, plan in zip(parts, plans, strict=True):
        if plan.dim != "n":
            raise PlaneError(part.name, "fused partition plan", "an 'n' plan", plan.dim)
        pieces.append(shard_planes(part, plan, rank))
    return fuse(pieces, planes.name)


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
    shards: Sequence[NVFP4Planes], plans: Sequence[ShardPlan], name: str | None = None
) -> NVFP4Planes:
    """Inverse of :func:`shard_fused`: every partition reassembled from its pieces by its
    plan, then fused again."""
    if not shards:
        raise PlaneError(name or "fused", "shards", "at least one", 0)
    per_rank = [unfuse(s) for s in shards]
    for rank, pieces in enumerate(per_rank):
        if len(pieces) != len(plans):
            raise PlaneError(shards[rank].name, f"rank {rank} partitions", len(plans), len(pieces))
    whole = [
        reassemble([pieces[i] for pieces in per_rank], plan).replace(name=f"{plan.name}")
        for i, plan in enumerate(plans)
    ]
    return fuse(whole, shards[0].name if name is None else name)


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
