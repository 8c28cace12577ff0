"""The canonical planes of an NVFP4 tensor, and their validation.

An NVFP4 weight is three arrays (spec 1.0, section "Canonical planes"):

=============== ======= =================== ============================================
plane           dtype   shape               meaning
=============== ======= =================== ============================================
``codes``       uint8   ``[E?, N, K/2]``    two E2M1 codes a byte, element 2j in the low
                                            nibble, 2j+1 in the high nibble
``scales``      uint8   ``[E?, N, K/16]``   one E4M3 byte per 16 elements along K
``global_scale`` float32 ``()``, ``(E,)``,   the DECODE multiplier (ModelOpt's
                        ``(P,)``, ``(E, P)`` ``weight_scale_2``), finite and > 0
=============== ======= =================== ============================================

``E`` is the optional expert axis (MoE weights are ``[E, N, K]``). ``P`` is the number of
fused partitions (q/k/v, gate/up) when ``partitions`` gives their row boundaries; each
partition keeps its own global.

Every :class:`NVFP4Planes` is checked structurally (O(1)) when it is made, so no kernel
ever sees a plane whose shapes disagree. :func:`validate` with ``content=True`` also reads
the scale bytes and the globals (O(n)); loaders and transcoders call it.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .spec import BLOCK_SIZE, E4M3_INVALID_BYTES, E4M3_NAN_BYTE

__all__ = [
    "NVFP4Planes",
    "PlaneError",
    "cgroup_memory_limit",
    "check_decoded_size",
    "check_planes_size",
    "describe",
    "expand_row_global",
    "memory_bytes",
    "validate",
]

#: The invalid scale bytes (:data:`nvfp4.spec.E4M3_INVALID_BYTES`) are every byte from the
#: NaN byte up, so one comparison finds them.
_FIRST_INVALID_SCALE = min(E4M3_INVALID_BYTES)
if frozenset(range(_FIRST_INVALID_SCALE, 256)) != E4M3_INVALID_BYTES:  # pragma: no cover
    raise ImportError("nvfp4.spec.E4M3_INVALID_BYTES is not a range up to 0xFF")


class PlaneError(ValueError):
    """A malformed NVFP4 plane. The message names the tensor, what was expected and what
    was found."""

    def __init__(self, tensor: str, what: str, expected: object, found: object) -> None:
        self.tensor = tensor
        self.what = what
        self.expected = expected
        self.found = found
        super().__init__(f"tensor {tensor!r}: {what}: expected {expected}, found {found}")


#: The bound where the physical memory cannot be read: the user address space of a 64-bit
#: CPU with 4-level page tables (128 TiB).
_ADDRESS_SPACE = 2**47


#: Where the cgroup file systems are mounted (v2 unified; v1 memory controller).
CGROUP_ROOT = "/sys/fs/cgroup"
#: More bytes than a cgroup limit file holds: its number and a newline.
_LIMIT_FILE_BYTES = 64


def _read_limit(path: str) -> int | None:
    """The byte limit in a cgroup file (``memory.max`` / ``memory.limit_in_bytes``), or
    ``None``: no such file, unreadable, ``max`` (no limit), or contents that are not one
    positive decimal integer (empty, a sign, a fraction, text, a huge file), which are
    read as no limit rather than trusted."""
    try:  # non-blocking: a FIFO in its place is read as empty, not waited on
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        raw = os.read(fd, _LIMIT_FILE_BYTES + 1)
    except OSError:  # a directory, a FIFO without a writer on some systems
        return None
    finally:
        os.close(fd)
    text = raw.strip()
    if len(raw) > _LIMIT_FILE_BYTES or not text.isdigit():
        return None  # "max", garbage, or more than a number
    value = int(text)
    return value if 0 < value < _ADDRESS_SPACE else None  # v1 says "none" with ~2**63


def _own_cgroups(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup paths, v2 (``0::/path``) and v1 memory controller
    (``N:...memory...:/path``), from ``/proc/self/cgroup``; ``None`` when not found. A
    path that climbs (``..``) is ignored."""
    v2 = v1 = None
    try:
        with open(proc_self_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except (OSError, ValueError):
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/") or ".." in parts[2].split("/"):
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def cgroup_memory_limit(
    root: str = CGROUP_ROOT, proc_self_cgroup: str = "/proc/self/cgroup"
) -> int | None:
    """The memory limit of this process's cgroup in bytes (a container's limit), or
    ``None`` when there is none or it cannot be read. cgroup v2: ``memory.max`` of the
    process's own cgroup, else of the root the container sees; v1: the memory controller's
    ``memory.limit_in_bytes``, likewise. The smallest limit found wins (a parent's limit
    binds its children). Hostile contents are handled: see :func:`_read_limit`."""
    v2, v1 = _own_cgroups(proc_self_cgroup)
    candidates = [os.path.join(root, "memory.max")]
    if v2 is not None:
        candidates.append(os.path.join(root, v2.lstrip("/"), "memory.max"))
    candidates.append(os.path.join(root, "memory", "memory.limit_in_bytes"))
    if v1 is not None:
        candidates.append(os.path.join(root, "memory", v1.lstrip("/"), "memory.limit_in_bytes"))
    limits = [v for v in map(_read_limit, candidates) if v is not None]
    return min(limits) if limits else None


@functools.cache
def memory_bytes() -> int:
    """The most bytes one weight's arrays may take: the machine's physical memory
    (``os.sysconf``) or, when lower, the memory limit of the process's cgroup (a
    container's, :func:`cgroup_memory_limit`), at most 2**47 (128 TiB, a 64-bit CPU's user
    address space), which is also the bound where neither can be read."""
    limit = _ADDRESS_SPACE
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        pages = page_size = 0
    if pages > 0 and page_size > 0:
        limit = min(limit, int(pages) * int(page_size))
    cgroup = cgroup_memory_limit()
    if cgroup is not None:
        limit = min(limit, cgroup)
    return limit


def _refuse_size(name: str, what: str, expected: str, shape: tuple[int, ...], need: int) -> None:
    limit = memory_bytes()
    if need > limit:
        raise PlaneError(
            name, what, f"{expected} (at most {limit} bytes)", f"{shape}: {need} bytes"
        )


def check_decoded_size(name: str, shape: tuple[int, ...]) -> None:
    """O(1), before anything is allocated: the float32 decode of a weight of logical shape
    ``shape`` fits in memory (:func:`memory_bytes`). A plane broadcast with zero strides
    (``np.broadcast_to``, ``as_strided``) can claim any logical size in a few bytes; every
    decoder refuses it here, naming the decoded size, instead of asking for terabytes."""
    _refuse_size(
        name,
        "decoded size",
        "a weight whose float32 decode fits in memory",
        tuple(int(d) for d in shape),
        4 * math.prod(int(d) for d in shape),
    )


def check_planes_size(planes: NVFP4Planes) -> None:
    """O(1), before anything is allocated: a contiguous copy of the planes (what a backend's
    ``prepare`` makes) fits in memory (:func:`memory_bytes`). Planes that hold their bytes
    always pass; broadcast (zero-stride) or overlapping ones of a huge logical size are
    refused here."""
    need = sum(
        math.prod(int(d) for d in a.shape) * a.itemsize
        for a in (planes.codes, planes.scales, planes.global_scale)
    )
    _refuse_size(
        planes.name,
        "planes size",
        "planes whose contiguous copy fits in memory",
        tuple(int(d) for d in planes.shape),
        need,
    )


def describe(a: object) -> str:
    """``'ndarray uint8 (4, 8)'`` or the type name, for error messages."""
    if isinstance(a, np.ndarray):
        return f"ndarray {a.dtype} {tuple(a.shape)}"
    return type(a).__name__


@dataclass(frozen=True, eq=False)
class NVFP4Planes:
    """The canonical (ModelOpt-layout) planes of one NVFP4 tensor.

    Attributes:
        codes: uint8 ``[E?, N, K/2]``, two E2M1 codes per byte (low nibble first).
        scales: uint8 ``[E?, N, K/16]``, E4M3 block-scale bytes, row-major ("linear").
        global_scale: float32 decode multiplier, shape ``()``, ``(E,)`` per expert, ``(P,)``
            per fused partition or ``(E, P)``. A Python float is accepted and stored as a
            0-d float32 array.
        partitions: row boundaries of fused partitions ``(0, n_0, n_0 + n_1, ..., N)``, or
            ``None`` for an unfused tensor.
        name: the tensor's name, used in every error message.
    """

    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint8]
    global_scale: npt.NDArray[np.float32]
    partitions: tuple[int, ...] | None = None
    name: str = field(default="tensor")

    def __post_init__(self) -> None:
        g: Any = self.global_scale
        if isinstance(g, (float, int)) and not isinstance(g, bool):
            object.__setattr__(self, "global_scale", np.asarray(g, dtype=np.float32))
        elif isinstance(g, np.floating) and g.dtype == np.float32:
            object.__setattr__(self, "global_scale", np.asarray(g))
        if self.partitions is not None and not isinstance(self.partitions, tuple):
            try:
                object.__setattr__(self, "partitions", tuple(self.partitions))
            except TypeError:
                raise PlaneError(
                    self.name, "partitions", "a tuple of row boundaries", describe(self.partitions)
                ) from None
        _check_structure(self)

    # ----------------------------------------------------------------- shape facts
    @property
    def num_experts(self) -> int | None:
        """``E`` for an expert-stacked tensor ``[E, N, K]``, else ``None``."""
        return int(self.codes.shape[0]) if self.codes.ndim == 3 else None

    @property
    def n(self) -> int:
        """Output rows N."""
        return int(self.codes.shape[-2])

    @property
    def k(self) -> int:
        """Contraction length K (a multiple of 16)."""
        return int(self.codes.shape[-1]) * 2

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the decoded tensor: ``(E?, N, K)``."""
        return (*self.codes.shape[:-1], self.k)

    @property
    def num_partitions(self) -> int | None:
        return None if self.partitions is None else len(self.partitions) - 1

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes + self.global_scale.nbytes)

    def row_global(self) -> npt.NDArray[np.float32]:
        """The global that applies to each output row: shape ``(N,)`` or ``(E, N)``
        (see :func:`expand_row_global`). Every decoder and matmul multiplies by it after
        accumulation."""
        return expand_row_global(self.global_scale, self.partitions, self.num_experts, self.n)

    def replace(self, **changes: Any) -> NVFP4Planes:
        """A copy with some fields changed (validated again)."""
        fields: dict[str, Any] = {
            "codes": self.codes,
            "scales": self.scales,
            "global_scale": self.global_scale,
            "partitions": self.partitions,
            "name": self.name,
        }
        fields.update(changes)
        return NVFP4Planes(**fields)


def expand_row_global(
    global_scale: npt.NDArray[np.float32],
    partitions: tuple[int, ...] | None,
    num_experts: int | None,
    n: int,
) -> npt.NDArray[np.float32]:
    """Per-row global, shape ``(N,)`` or ``(E, N)``: a scalar or per-expert global is
    broadcast over rows; a per-partition global is repeated over its partition's rows."""
    g = np.asarray(global_scale, dtype=np.float32)
    shape = (num_experts, n) if num_experts is not None else (n,)
    if partitions is None or g.ndim == 0:
        per = g.reshape(-1, 1) if (num_experts is not None and g.ndim == 1) else g
        return np.ascontiguousarray(np.broadcast_to(per, shape), dtype=np.float32)
    bounds = np.asarray(partitions, dtype=np.int64)
    sizes = bounds[1:] - bounds[:-1]
    return np.repeat(g, sizes, axis=-1).astype(np.float32, copy=False)


def _check_structure(p: NVFP4Planes) -> None:
    """O(1) checks: dtypes, ranks, agreeing shapes, K % 16, global shape, partitions."""
    name = p.name if isinstance(p.name, str) else repr(p.name)
    codes, scales, g = p.codes, p.scales, p.global_scale
    for plane, arr in (("codes", codes), ("scales", scales), ("global_scale", g)):
        if not isinstance(arr, np.ndarray):
            raise PlaneError(name, f"{plane} type", "numpy.ndarray", describe(arr))
    if codes.dtype != np.uint8:
        raise PlaneError(name, "codes dtype", "uint8", codes.dtype)
    if scales.dtype != np.uint8:
        raise PlaneError(name, "scales dtype", "uint8 (E4M3 bytes)", scales.dtype)
    if g.dtype != np.float32:
        raise PlaneError(name, "global_scale dtype", "float32", g.dtype)
    if codes.ndim not in (2, 3):
        raise PlaneError(name, "codes rank", "2 ([N, K/2]) or 3 ([E, N, K/2])", codes.ndim)
    if scales.ndim != codes.ndim:
        raise PlaneError(name, "scales rank", f"{codes.ndim} (same as codes)", scales.ndim)
    if codes.shape[:-1] != scales.shape[:-1]:
        raise PlaneError(
            name,
            "scales leading shape",
            f"{tuple(codes.shape[:-1])} (codes' leading axes)",
            tuple(scales.shape[:-1]),
        )
    if any(d == 0 for d in codes.shape[:-1]):
        raise PlaneError(name, "rows / experts", "at least 1 each", tuple(codes.shape[:-1]))
    half_k = int(codes.shape[-1])
    if half_k == 0 or half_k % (BLOCK_SIZE // 2) != 0:
        raise PlaneError(
            name, "K (= 2 * codes.shape[-1])", f"a positive multiple of {BLOCK_SIZE}", 2 * half_k
        )
    k_blocks = 2 * half_k // BLOCK_SIZE
    if scales.shape[-1] != k_blocks:
        raise PlaneError(
            name,
            "scales.shape[-1]",
            f"K/16 = {k_blocks} for K = {2 * half_k}",
            scales.shape[-1],
        )
    n = int(codes.shape[-2])
    e = int(codes.shape[0]) if codes.ndim == 3 else None
    check_partitions(p.partitions, n, name)
    check_global_shape(g, e, p.partitions, name)


def check_partitions(parts: tuple[int, ...] | None, n: int, name: str) -> None:
    """Partition boundaries are integers ``(0, ..., N)``, strictly increasing."""
    if parts is None:
        return
    if not isinstance(parts, tuple):
        raise PlaneError(name, "partitions", "a tuple of row boundaries", type(parts).__name__)
    if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in parts):
        raise PlaneError(name, "partitions", "integer row boundaries", parts)
    if len(parts) < 2 or parts[0] != 0 or parts[-1] != n:
        raise PlaneError(name, "partitions", f"(0, ..., {n}) with at least 2 entries", parts)
    if any(b <= a for a, b in itertools.pairwise(parts)):
        raise PlaneError(name, "partitions", "strictly increasing row boundaries", parts)


def check_global_shape(
    g: npt.NDArray[np.float32], e: int | None, parts: tuple[int, ...] | None, name: str
) -> None:
    """The global is a scalar, or one value per expert and/or per partition."""
    allowed: list[tuple[int, ...]] = [()]
    full: tuple[int, ...] = ((e,) if e is not None else ()) + (
        (len(parts) - 1,) if parts is not None else ()
    )
    if full:
        allowed.append(full)
    if tuple(g.shape) not in allowed:
        raise PlaneError(
            name, "global_scale shape", " or ".join(str(s) for s in allowed), tuple(g.shape)
        )


def _distinct(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``a`` without its stride-0 (broadcast) axes: the same values, each stored once, so
    that a huge broadcast plane is checked in the memory it really holds."""
    index = tuple(
        slice(0, 1) if st == 0 and d > 1 else slice(None)
        for st, d in zip(a.strides, a.shape, strict=True)
    )
    return a[index] if index else a


def _check_content(p: NVFP4Planes) -> None:
    """O(n) checks: every scale byte a valid positive E4M3 value, every global finite > 0.
    Broadcast axes are read once; scales that still cannot be compared in memory (an
    ``as_strided`` view whose rows overlap, claiming terabytes) are refused first."""
    s = _distinct(p.scales)
    _refuse_size(
        p.name,
        "scales size",
        "scale bytes whose check fits in memory",
        tuple(int(d) for d in p.scales.shape),
        math.prod(int(d) for d in s.shape),
    )
    bad = s >= _FIRST_INVALID_SCALE  # E4M3_INVALID_BYTES: the NaN byte and bit 7 set
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        byte = int(s[idx])
        raise PlaneError(
            p.name,
            f"scale byte at {idx}",
            f"0x00..0x{_FIRST_INVALID_SCALE - 1:02X} (bit 7 clear, not the NaN byte "
            f"0x{E4M3_NAN_BYTE:02X})",
            f"0x{byte:02X}",
        )
    g = _distinct(p.global_scale)
    ok = np.isfinite(g) & (g > 0)
    if not ok.all():
        idx = tuple(int(i) for i in np.argwhere(~ok)[0]) if g.ndim else ()
        raise PlaneError(p.name, f"global_scale at {idx}", "finite and > 0", float(g[idx]))


def validate(planes: NVFP4Planes, content: bool = False) -> NVFP4Planes:
    """Check an :class:`NVFP4Planes` and return it.

    Structure (dtypes, ranks, agreeing shapes, K % 16, global shape against experts and
    partitions) is always checked, in O(1). With ``content=True`` the scale bytes (bit 7
    set or 0x7F refused) and the globals (finite, > 0) are read too, in O(n): do that at
    load and transcode time. Raises :class:`PlaneError` naming the tensor, the expected
    and the found.
    """
    if not isinstance(planes, NVFP4Planes):
        raise PlaneError("<unnamed>", "planes type", "nvfp4.NVFP4Planes", describe(planes))
    _check_structure(planes)
    if content:
        _check_content(planes)
    return planes
