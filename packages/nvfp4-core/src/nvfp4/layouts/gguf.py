"""The GGUF / ggml ``NVFP4`` layout (ggml type 40, llama.cpp).

A row of K elements (K a multiple of 64) is ``K / 64`` super-blocks of 36 bytes::

    byte  0 ..  3   d[0..3]   the E4M3 scale bytes of the super-block's four 16-groups
                             (unsigned: written ``& 0x7F``)
    byte  4 .. 35   qs[0..31] the codes: group s (0..3) owns qs[8s .. 8s+7], and byte
                             qs[8s + j] holds element j of the group in its low nibble and
                             element j + 8 in its high nibble (j = 0..7)

so tensor data is uint8 ``[E?, N, K/64 * 36]``. The canonical planes hold element ``2b`` of
a group in the low nibble of byte ``b`` and ``2b+1`` in the high nibble, so the transcode
reorders nibbles inside each 8-byte group (a pure bit shuffle, never a decode):
with canonical bytes ``c[0..7]`` of a group and ``m = 0..3``::

    qs[2m]   = (c[m] & 0x0F) | (c[m+4] << 4)      # elements 2m, 2m+8
    qs[2m+1] = (c[m] >> 4)   | (c[m+4] & 0xF0)    # elements 2m+1, 2m+9

and the inverse ``c[m] = (qs[2m] & 0x0F) | (qs[2m+1] << 4)``,
``c[m+4] = (qs[2m] >> 4) | (qs[2m+1] & 0xF0)``.

The decode global is a separate F32 tensor ``<name>.scale`` of shape ``[1]`` (or ``[E]`` for
merged experts) that llama.cpp multiplies into the matmul output. ggml's own value table is
E2M1 doubled and its scale decode halves the E4M3 value, so the decoded numbers are the
canonical ``e2m1 * e4m3 * scale``. llama.cpp's converter omits a ``.scale`` equal to 1.0:
:func:`from_gguf` takes ``scale=None`` as 1.0.

Refusals: K % 64 != 0, and planes whose partitions carry different globals (one ``.scale``
cannot express them; unfuse, or reconcile with :func:`nvfp4.fusion.reconcile_globals`).

Rows are processed in chunks of about :data:`CHUNK_BYTES` of GGUF data (at least one row), so
the temporaries stay in the CPU's cache and the peak memory of a transcode is about its
output's size. :func:`iter_gguf_data` yields the data chunk by chunk in file order, for a
writer that streams a tensor without holding it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..planes import NVFP4Planes, PlaneError, validate
from ..spec import BLOCK_SIZE, GGUF_BLOCK_BYTES, GGUF_SUPER_BLOCK, GGUF_TYPE_NVFP4
from ._common import as_bytes, as_float32_exact, describe, per_expert_global

__all__ = [
    "CHUNK_BYTES",
    "GGUF_TYPE",
    "from_gguf",
    "gguf_global",
    "gguf_row_bytes",
    "iter_gguf_data",
    "to_gguf",
]

#: ggml type id of NVFP4 (from :mod:`nvfp4.spec`).
GGUF_TYPE: Final = GGUF_TYPE_NVFP4
#: GGUF data bytes transcoded at a time (whole rows, at least one): small enough that a chunk
#: and its two shuffle buffers stay in a core's L2 cache.
CHUNK_BYTES: Final = 512 * 1024

_GROUPS = GGUF_SUPER_BLOCK // BLOCK_SIZE  # 16-groups per super-block (4)
_SCALE_BYTES = _GROUPS  # one scale byte per group
_GROUP_BYTES = BLOCK_SIZE // 2  # code bytes per group (8)


def gguf_row_bytes(k: int) -> int:
    """Bytes of one GGUF NVFP4 row of ``k`` elements (``k`` a multiple of 64)."""
    return k // GGUF_SUPER_BLOCK * GGUF_BLOCK_BYTES


def _row_chunks(lead: tuple[int, ...], n: int, row_bytes: int) -> Iterator[tuple[int | slice, ...]]:
    """Index tuples ``(rows,)`` or ``(expert, rows)`` covering every row in order, about
    CHUNK_BYTES of GGUF data at a time (the only Python loops run over experts and chunks)."""
    step = max(1, CHUNK_BYTES // row_bytes)
    experts: list[tuple[int, ...]] = [(e,) for e in range(lead[0])] if lead else [()]
    for e in experts:
        for r0 in range(0, n, step):
            yield (*e, slice(r0, min(r0 + step, n)))


def _view(a: npt.NDArray[np.uint8], shape: tuple[int, ...]) -> npt.NDArray[np.uint8]:
    """``a`` reshaped without a copy (a destination must stay a view of the output)."""
    v = a.reshape(shape)
    if not np.may_share_memory(v, a):  # pragma: no cover - the shapes above always allow a view
        raise RuntimeError(f"internal: reshape of {a.shape} to {shape} would copy")
    return v


# A 16-element group is 8 code bytes. Read little-endian as one 64-bit word, nibble ``i``
# (bits 4i..4i+3) of the canonical word is element ``i``; in the ggml word, nibble ``2j`` is
# element ``j`` and nibble ``2j+1`` is element ``j+8``. Going from one to the other is a
# perfect shuffle of the word's 16 nibbles (the low eight interleaved with the high eight),
# done with three "delta swaps": each exchanges two bit fields ``shift`` apart where
# ``mask`` is set. Undoing it runs the same swaps in the opposite order.
_SHUFFLE: Final = (
    (np.uint64(16), np.uint64(0x00000000FFFF0000)),  # swap the middle two 16-bit quarters
    (np.uint64(8), np.uint64(0x0000FF000000FF00)),  # then the middle bytes of each half
    (np.uint64(4), np.uint64(0x00F000F000F000F0)),  # then the middle nibbles of each 16 bits
)


def _delta_swaps(words: npt.NDArray[np.uint64], order: Any) -> npt.NDArray[np.uint64]:
    """The swaps of ``order`` applied to a copy of ``words``, in place (two buffers, no
    temporaries per operation: this is the hot loop of a GGUF transcode)."""
    w = words.copy()
    t = np.empty_like(w)
    for shift, mask in order:
        np.right_shift(w, shift, out=t)  # t = ((w >> shift) ^ w) & mask: the bits to swap
        t ^= w
        t &= mask
        w ^= t  # flip them in the low field ...
        t <<= shift
        w ^= t  # ... and in the high field
    return w


def _to_ggml_nibbles(c: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> None:
    """Canonical code bytes ``[..., 8]`` -> ggml qs bytes written into ``out`` ``[..., 8]``."""
    words = np.ascontiguousarray(c).view("<u8")
    out[...] = _delta_swaps(words, _SHUFFLE).view(np.uint8).reshape(out.shape)


def _from_ggml_nibbles(q: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> None:
    """ggml qs bytes ``[..., 8]`` -> canonical code bytes written into ``out`` ``[..., 8]``."""
    words = np.ascontiguousarray(q).view("<u8")
    out[...] = _delta_swaps(words, _SHUFFLE[::-1]).view(np.uint8).reshape(out.shape)


def _single_global(planes: NVFP4Planes) -> npt.NDArray[np.float32]:
    """The planes' global without a partition axis (``()`` or ``(E,)``), or a refusal."""
    g = planes.global_scale
    if planes.partitions is None or g.ndim == 0:
        return g
    first = g[..., :1]
    if bool(np.all(g == first)):
        return first[..., 0]
    ratio = float(np.max(g.max(axis=-1) / g.min(axis=-1)))
    raise PlaneError(
        planes.name,
        "per-partition globals for GGUF",
        "one global per tensor (GGUF has a single .scale): unfuse with nvfp4.fusion.unfuse, "
        "or reconcile explicitly with nvfp4.fusion.reconcile_globals",
        f"{g.shape[-1]} partitions with globals differing by up to {ratio:.6g}x",
    )


def to_gguf(planes: NVFP4Planes) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """Canonical planes -> GGUF NVFP4 ``(data, scale)``.

    ``data`` is uint8 ``[E?, N, K/64 * 36]`` (the tensor's bytes, ggml type :data:`GGUF_TYPE`);
    ``scale`` is the float32 ``<name>.scale`` tensor, shape ``(1,)`` or ``(E,)`` for
    expert-stacked planes. The content is validated first. Raises
    :class:`~nvfp4.PlaneError` when K is not a multiple of 64 or when partitions carry
    different globals.
    """
    scale = gguf_global(planes)
    lead = tuple(planes.codes.shape[:-2])
    data = np.empty((*lead, planes.n, gguf_row_bytes(planes.k)), dtype=np.uint8)
    for idx in _row_chunks(lead, planes.n, data.shape[-1]):
        _transcode_rows(planes, idx, data[idx])
    return data, scale


def gguf_global(planes: NVFP4Planes) -> npt.NDArray[np.float32]:
    """Validate ``planes`` for GGUF (content, K % 64, one global per tensor or expert) and
    return the float32 ``<name>.scale`` tensor, shape ``(1,)`` or ``(E,)``."""
    validate(planes, content=True)
    k = planes.k
    if k % GGUF_SUPER_BLOCK:
        raise PlaneError(
            planes.name, "K for GGUF NVFP4", f"a multiple of {GGUF_SUPER_BLOCK}", f"K = {k}"
        )
    g = _single_global(planes)
    e = planes.num_experts
    return per_expert_global(g, e) if e is not None else np.array(g, dtype=np.float32).reshape(1)


def iter_gguf_data(
    planes: NVFP4Planes,
    buffer: Callable[[int], npt.NDArray[np.uint8]] | None = None,
) -> Iterator[npt.NDArray[np.uint8]]:
    """The GGUF data of ``planes`` as consecutive uint8 chunks ``[rows, K/64 * 36]`` in file
    order (whole rows, about :data:`CHUNK_BYTES` each; experts one after the other).

    Call :func:`gguf_global` first: it validates the planes, which this does not repeat.
    ``buffer(nbytes)`` supplies the memory of each chunk (a 1-D uint8 array of at least
    ``nbytes``; by default a new one), so a writer can recycle a few buffers while it streams
    a tensor of any size.
    """
    lead = tuple(planes.codes.shape[:-2])
    row_bytes = gguf_row_bytes(planes.k)
    for idx in _row_chunks(lead, planes.n, row_bytes):
        rows_slice = idx[-1]
        assert isinstance(rows_slice, slice)  # _row_chunks ends every index with one
        rows = rows_slice.stop - rows_slice.start
        nbytes = rows * row_bytes
        mem = np.empty(nbytes, dtype=np.uint8) if buffer is None else buffer(nbytes)
        out = mem[:nbytes].reshape(rows, row_bytes)
        _transcode_rows(planes, idx, out)
        yield out


def _transcode_rows(
    planes: NVFP4Planes, idx: tuple[int | slice, ...], out: npt.NDArray[np.uint8]
) -> None:
    """Rows ``idx`` of the canonical planes -> their GGUF bytes in ``out`` ``[rows, row_bytes]``
    (``out`` must be writable through views: a slice of the output or a fresh buffer)."""
    supers = planes.k // GGUF_SUPER_BLOCK
    dst = _view(out, (-1, supers, GGUF_BLOCK_BYTES))
    rows = dst.shape[0]
    src_scales = planes.scales[idx].reshape(rows, supers, _SCALE_BYTES)
    np.bitwise_and(src_scales, 0x7F, out=dst[..., :_SCALE_BYTES])
    codes = planes.codes[idx].reshape(rows, supers, _GROUPS, _GROUP_BYTES)
    qs = _view(dst[..., _SCALE_BYTES:], (rows, supers, _GROUPS, _GROUP_BYTES))
    _to_ggml_nibbles(codes, qs)


def from_gguf(
    data: Any, scale: Any = None, name: str = "tensor", k: int | None = None
) -> NVFP4Planes:
    """GGUF NVFP4 ``(data, scale)`` -> canonical planes, validated with ``content=True``.

    Args:
        data: uint8 ``[N, K/64 * 36]`` or ``[E, N, K/64 * 36]`` (K inferred), or a flat
            1-D buffer of whole rows when ``k`` is given.
        scale: the float32 ``<name>.scale`` tensor, shape ``()``, ``(1,)`` or ``(E,)``
            (per expert for 3-D data, a stack of one expert's ``(1,)`` included);
            ``None`` means 1.0 (llama.cpp's converter omits a scale of 1.0).
        name: the tensor's name, for the planes and their errors.
        k: the row length K, checked against ``data`` (required for flat data).

    A scale byte with bit 7 set or 0x7F is refused (ggml ignores bit 7; a conforming
    converter never writes it).
    """
    arr = as_bytes(np.asarray(data), name, "GGUF NVFP4 data")
    if k is not None:
        if not isinstance(k, (int, np.integer)) or k <= 0 or k % GGUF_SUPER_BLOCK:
            raise PlaneError(name, "K for GGUF NVFP4", f"a multiple of {GGUF_SUPER_BLOCK}", k)
        row_bytes = int(k) // GGUF_SUPER_BLOCK * GGUF_BLOCK_BYTES
        if arr.ndim == 1:
            if arr.size % row_bytes or arr.size == 0:
                raise PlaneError(
                    name, "GGUF data size", f"a positive multiple of {row_bytes} bytes", arr.size
                )
            arr = arr.reshape(-1, row_bytes)
        if arr.shape[-1] != row_bytes:
            raise PlaneError(name, "GGUF row bytes", f"{row_bytes} for K = {k}", tuple(arr.shape))
    if arr.ndim not in (2, 3):
        raise PlaneError(
            name, "GGUF data rank", "2 ([N, K/64*36]) or 3 ([E, N, K/64*36])", describe(arr)
        )
    if arr.shape[-1] == 0 or arr.shape[-1] % GGUF_BLOCK_BYTES:
        raise PlaneError(
            name,
            "GGUF row bytes",
            f"a positive multiple of {GGUF_BLOCK_BYTES} (one super-block per 64 elements)",
            arr.shape[-1],
        )
    lead = tuple(arr.shape[:-2])
    n, supers = int(arr.shape[-2]), arr.shape[-1] // GGUF_BLOCK_BYTES
    experts = lead[0] if lead else None
    g = _gguf_scale(scale, experts, name)

    k_blocks = supers * _GROUPS
    codes = np.empty((*lead, n, k_blocks * _GROUP_BYTES), dtype=np.uint8)
    scales = np.empty((*lead, n, k_blocks), dtype=np.uint8)
    for idx in _row_chunks(lead, n, int(arr.shape[-1])):
        src = arr[idx].reshape(-1, supers, GGUF_BLOCK_BYTES)
        rows = src.shape[0]
        scales[idx] = src[..., :_SCALE_BYTES].reshape(rows, k_blocks)
        qs = src[..., _SCALE_BYTES:].reshape(rows, supers, _GROUPS, _GROUP_BYTES)
        _from_ggml_nibbles(qs, _view(codes[idx], (rows, supers, _GROUPS, _GROUP_BYTES)))
    planes = NVFP4Planes(codes=codes, scales=scales, global_scale=g, name=name)
    return validate(planes, content=True)


def _gguf_scale(scale: Any, experts: int | None, name: str) -> npt.NDArray[np.float32]:
    if scale is None:
        return np.asarray(1.0, dtype=np.float32)
    g = as_float32_exact(np.asarray(scale), name, "GGUF .scale")
    if experts is not None and g.shape == (experts,):
        return g  # per expert, also for one expert: a GGUF stack has no shared global
    if g.shape in ((), (1,)):
        return g.reshape(())
    allowed = "() or (1,)" + (f" or ({experts},) per expert" if experts is not None else "")
    raise PlaneError(name, "GGUF .scale shape", allowed, tuple(g.shape))
