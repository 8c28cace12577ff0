"""NVFP4 as torch operators: ``torch.ops.nvfp4.*``, for engines that consume kernels as ops.

Importing this module registers, with :mod:`torch.library` (importing
:mod:`nvfp4_torch.modules` or any module that uses them imports it):

=========================  ==================================================================
``nvfp4::qmm``             ``(x, codes, scales, global_scale, partitions=None) -> y [..., N]``
``nvfp4::gather_qmm``      ``(x, codes, scales, global_scale, expert_ids, sorted_indices=False)``
``nvfp4::dequantize``      ``(codes, scales, global_scale, dtype, partitions=None)``
``nvfp4::qmm_w4a4``        ``(x, codes, scales, global_scale, input_scale=None, partitions=None)``
``nvfp4::qmm_w4a8``        ``(x, codes, scales, global_scale, partitions=None)``
``nvfp4::gather_qmm_w4a8`` ``(x, codes, scales, global_scale, expert_ids, sorted_indices=False)``
``nvfp4::qmm_w4a8_fp8``    ``(x, codes, scales, global_scale, input_scale=None, partitions=None)``
=========================  ==================================================================

The weight is passed as its canonical planes (the tensors of a ModelOpt checkpoint):
``codes`` uint8 ``[E?, N, K/2]``, ``scales`` uint8 or ``torch.float8_e4m3fn``
``[E?, N, K/16]``, ``global_scale`` float32 (the decode multiplier: ``()``, ``(E,)``,
``(P,)`` with ``partitions``). The output has x's dtype (float32, float16, bfloat16);
``dequantize`` takes the dtype.

Each op runs the NVFP4 backend chosen for x's device (:func:`backend_for`: ``cpu`` then
``reference`` on CPU tensors; ``cuda``, or ``rocm`` under a ROCm build of torch, on GPU
tensors; :func:`use_backend` overrides), through core's verbs, so every argument check and
error message is the one of :class:`nvfp4.Frontend`. A weight is validated and prepared
once: the prepared handle is cached, keyed by the planes' storage and torch's version
counters (an in-place write to a plane re-prepares it). The cache holds the planes alive;
:func:`clear_cache` empties it.

Every op has a fake (meta) implementation, so ``torch.compile(fullgraph=True)`` traces a
model that uses them. There is no autograd formula (NVFP4 weights are inference weights).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from nvfp4.backend import Frontend, Prepared
from nvfp4.contract import VERBS
from nvfp4.planes import NVFP4Planes
from nvfp4.registry import get_backend

from .arrays import from_numpy, to_numpy

__all__ = [
    "OPS",
    "backend_for",
    "clear_cache",
    "op_kind",
    "plane_tensors",
    "register",
    "use_backend",
]

#: Backends tried, in order, for tensors of a device type (the first available wins).
DEFAULT_BACKENDS: dict[str, tuple[str, ...]] = {"cpu": ("cpu", "reference"), "cuda": ("cuda",)}
#: Prepared weights kept (least recently used dropped first).
CACHE_SIZE = 4096

_lock = threading.Lock()
_chosen: dict[str, Frontend] = {}
_cache: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], Prepared]] = OrderedDict()


# ------------------------------------------------------------------------ backends
def use_backend(device_type: str, backend: str | Frontend | None) -> None:
    """Run the ops on tensors of ``device_type`` (``"cpu"``, ``"cuda"``) with ``backend``
    (a registered name or a :class:`nvfp4.Frontend`); ``None`` restores the default."""
    with _lock:
        if backend is None:
            _chosen.pop(device_type, None)
        else:
            _chosen[device_type] = (
                backend if isinstance(backend, Frontend) else get_backend(backend)
            )


def backend_for(device: torch.device) -> Frontend:
    """The backend the ops use for tensors on ``device``."""
    kind = device.type
    with _lock:
        if kind in _chosen:
            return _chosen[kind]
    names = DEFAULT_BACKENDS.get(kind, ())
    if kind == "cuda" and getattr(torch.version, "hip", None):
        names = ("rocm",)
    reasons = []
    for name in names:
        try:
            b = get_backend(name)
        except Exception as exc:  # not installed: try the next
            reasons.append(f"{name}: {exc}")
            continue
        available = b.availability()
        if available.ok:
            with _lock:
                _chosen.setdefault(kind, b)
                return _chosen[kind]
        reasons.append(f"{name}: {available.reason}")
    tried = "; ".join(reasons) if reasons else "no NVFP4 backend serves this device type"
    raise RuntimeError(f"torch.ops.nvfp4 on {kind} tensors: no backend can run ({tried})")


def clear_cache() -> None:
    """Forget every prepared weight (and release the planes the cache holds)."""
    with _lock:
        _cache.clear()


# -------------------------------------------------------------------- conversions
#: Whether each backend's native arrays are torch tensors, asked once per backend.
_NATIVE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _torch_native(b: Frontend) -> bool:
    """Whether the backend's native arrays are torch tensors (the Triton backends); every op
    call asks, so the answer is kept per backend object."""
    native = _NATIVE.get(b)
    if native is None:
        native = isinstance(b.from_numpy(np.zeros((1, 1), np.float32)), torch.Tensor)
        _NATIVE[b] = native
    return native


def _native_in(b: Frontend, t: torch.Tensor) -> Any:
    return t.contiguous() if _torch_native(b) else to_numpy(t)


def _native_out(b: Frontend, y: Any, device: torch.device) -> torch.Tensor:
    if isinstance(y, torch.Tensor):
        return y.to(device)
    return from_numpy(np.asarray(b.to_numpy(y)), device)


def plane_tensors(planes: NVFP4Planes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(codes, scales, global_scale)`` tensors of canonical planes (copies)."""
    return (
        torch.from_numpy(np.array(planes.codes)),
        torch.from_numpy(np.array(planes.scales)),
        torch.from_numpy(np.array(planes.global_scale, dtype=np.float32)),
    )


def _planes(
    codes: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    partitions: Sequence[int] | None,
) -> NVFP4Planes:
    if scales.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError(
            f"torch.ops.nvfp4: scales dtype expected uint8 or float8_e4m3fn, found {scales.dtype}"
        )
    g = to_numpy(global_scale)
    return NVFP4Planes(
        to_numpy(codes),
        to_numpy(scales),
        g,
        partitions=None if partitions is None else tuple(int(p) for p in partitions),
        name="torch.ops.nvfp4 weight",
    )


def _prepared(
    b: Frontend,
    codes: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor,
    partitions: Sequence[int] | None,
) -> Prepared:
    """The backend's prepared handle of these planes, from the cache when the planes are
    the same storage at the same version (the entry holds them, so no other tensor can
    take their addresses while it lives)."""
    tensors = (codes, scales, global_scale)
    key = (
        b.name,
        id(b),
        *(
            (t.device.type, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
            for t in tensors
        ),
        None if partitions is None else tuple(int(p) for p in partitions),
    )
    versions = tuple(t._version for t in tensors)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0][1] == versions:
            _cache.move_to_end(key)
            return hit[1]
    prepared = b.prepare(_planes(codes, scales, global_scale, partitions))
    with _lock:
        _cache[key] = ((tensors, versions), prepared)
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return prepared


# ------------------------------------------------------------------ fake shapes
def _fake_matmul(x: torch.Tensor, codes: torch.Tensor, experts: bool) -> torch.Tensor:
    want = 3 if experts else 2
    if codes.dim() != want:
        raise ValueError(
            f"torch.ops.nvfp4: codes rank expected {want}, found shape {tuple(codes.shape)}"
        )
    k = 2 * codes.shape[-1]
    if x.shape[-1] != k:
        raise ValueError(f"torch.ops.nvfp4: x's last axis expected K = {k}, found {x.shape[-1]}")
    return x.new_empty((*x.shape[:-1], codes.shape[-2]))


# ------------------------------------------------------------------------- ops
#: The operators: one per matmul verb of :data:`nvfp4.contract.VERBS`, by its argument shape:
#: ``matmul`` ``(x, codes, scales, global_scale, partitions=None)``, ``scaled`` (a static
#: activation scale) ``(..., input_scale=None, partitions=None)``, ``gather`` (expert stacks)
#: ``(..., expert_ids, sorted_indices=False)``; and ``dequantize``. Each op is the verb of its
#: name on the prepared weight.
def op_kind(verb: str) -> str:
    """The operator shape of a matmul verb of :data:`nvfp4.contract.VERBS`."""
    spec = VERBS[verb]
    if spec.kind != "matmul":
        raise ValueError(f"torch.ops.nvfp4: {verb!r} is a {spec.kind} verb, not a matmul")
    return "gather" if spec.experts else "scaled" if spec.input_scale else "matmul"


_WEIGHT = "Tensor x, Tensor codes, Tensor scales, Tensor global_scale"
#: The schema of each kind (and of ``dequantize``), in torch's operator syntax.
SCHEMAS: dict[str, str] = {
    "matmul": f"({_WEIGHT}, int[]? partitions=None) -> Tensor",
    "scaled": f"({_WEIGHT}, float? input_scale=None, int[]? partitions=None) -> Tensor",
    "gather": f"({_WEIGHT}, Tensor expert_ids, bool sorted_indices=False) -> Tensor",
    "dequantize": (
        "(Tensor codes, Tensor scales, Tensor global_scale, ScalarType dtype, "
        "int[]? partitions=None) -> Tensor"
    ),
}


def _matmul_op(verb: str) -> Callable[..., torch.Tensor]:
    def run(x: torch.Tensor, codes: Any, scales: Any, g: Any, partitions: Any = None) -> Any:
        b = backend_for(x.device)
        w = _prepared(b, codes, scales, g, partitions)
        return _native_out(b, getattr(b, verb)(_native_in(b, x), w), x.device)

    return run


def _scaled_op(verb: str) -> Callable[..., torch.Tensor]:
    def run(
        x: torch.Tensor,
        codes: Any,
        scales: Any,
        g: Any,
        input_scale: Any = None,
        partitions: Any = None,
    ) -> Any:
        b = backend_for(x.device)
        w = _prepared(b, codes, scales, g, partitions)
        y = getattr(b, verb)(_native_in(b, x), w, input_scale=input_scale)
        return _native_out(b, y, x.device)

    return run


def _gather_op(verb: str) -> Callable[..., torch.Tensor]:
    def run(
        x: torch.Tensor,
        codes: Any,
        scales: Any,
        g: Any,
        expert_ids: Any,
        sorted_indices: bool = False,
    ) -> Any:
        b = backend_for(x.device)
        w = _prepared(b, codes, scales, g, None)
        ids = _native_in(b, expert_ids)
        y = getattr(b, verb)(_native_in(b, x), w, ids, sorted_indices=sorted_indices)
        return _native_out(b, y, x.device)

    return run


def _fake(experts: bool) -> Callable[..., torch.Tensor]:
    def fake(x: torch.Tensor, codes: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        return _fake_matmul(x, codes, experts=experts)

    return fake


_MAKERS = {"matmul": _matmul_op, "scaled": _scaled_op, "gather": _gather_op}


def register(verb: str) -> Any:
    """Register ``torch.ops.nvfp4.<verb>`` for a matmul verb of
    :data:`nvfp4.contract.VERBS` (done at import for every one; a verb added to the table
    later is registered by calling this) and return it."""
    kind = op_kind(verb)
    if verb in OPS:
        return OPS[verb]
    op = torch.library.custom_op(
        f"nvfp4::{verb}", _MAKERS[kind](verb), mutates_args=(), schema=SCHEMAS[kind]
    )
    op.register_fake(_fake(experts=kind == "gather"))
    OPS[verb] = op
    return op


#: The registered operators by name (also ``torch.ops.nvfp4.<name>``).
OPS: dict[str, Any] = {}
for _verb, _spec in VERBS.items():
    if _spec.kind == "matmul":
        register(_verb)

#: ``dequantize``'s output dtypes, by torch dtype.
_DEQUANTIZE_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def _dequantize(
    codes: torch.Tensor, scales: Any, g: Any, dtype: torch.dtype, partitions: Any = None
) -> Any:
    """The dense weight ``[E?, N, K]`` in ``dtype``, exactly (spec 1.0 ``dequantize``)."""
    b = backend_for(codes.device)
    w = _prepared(b, codes, scales, g, partitions)
    if dtype not in _DEQUANTIZE_DTYPES:
        raise TypeError(
            f"torch.ops.nvfp4.dequantize: dtype expected float32, float16 or bfloat16, found {dtype}"
        )
    return _native_out(b, b.dequantize(w, _DEQUANTIZE_DTYPES[dtype]), codes.device)


def _dequantize_fake(
    codes: torch.Tensor, scales: Any, g: Any, dtype: torch.dtype, partitions: Any = None
) -> torch.Tensor:
    return codes.new_empty((*codes.shape[:-1], 2 * codes.shape[-1]), dtype=dtype)


OPS["dequantize"] = torch.library.custom_op(
    "nvfp4::dequantize", _dequantize, mutates_args=(), schema=SCHEMAS["dequantize"]
)
OPS["dequantize"].register_fake(_dequantize_fake)
