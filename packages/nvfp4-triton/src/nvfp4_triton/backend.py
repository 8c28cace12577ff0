"""The :class:`nvfp4.backend.Backend` contract over the shared Triton kernels.

:class:`TritonBackend` implements every verb once, for every GPU vendor: input checks,
planes validation, dtype defaults, the conversions to and from numpy, and the calls into
:mod:`nvfp4_triton.ops`. A vendor backend (``nvfp4-cuda``, ``nvfp4-rocm``) subclasses it and
supplies only what differs between vendors:

* :meth:`TritonBackend.detect` - the :class:`Platform`: is there a usable device (or the
  interpreter), what it is called, which :class:`~nvfp4_triton.config.KernelConfig` fits it;
* :meth:`TritonBackend.qmm_path` / :meth:`TritonBackend.gather_path` - its dispatch table;
* :meth:`TritonBackend.w4a4_supported` / :meth:`TritonBackend.w4a4_matmul` - a native W4A4
  GEMM where the hardware has one (the ``w4a4`` capability is declared only then);
* the class attributes ``NAME``, ``PRIORITY``, ``PACKAGE`` and ``NOTES``.

Native arrays are torch tensors on the platform's device (CPU tensors under the
interpreter). Verbs accept numpy arrays too, and raw :class:`nvfp4.NVFP4Planes` where a
prepared weight is expected (validated and moved on the spot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.backend import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes, validate
from nvfp4.spec import SUPPORTED_SPEC_VERSIONS

from . import ops
from .config import KernelConfig
from .weights import DeviceWeight, upload

__all__ = ["BASE_CAPABILITIES", "Platform", "TritonBackend", "torch_dtype"]

#: Capabilities every Triton backend has (``w4a4`` is added where it is native).
BASE_CAPABILITIES = frozenset(
    {"dequantize", "qmm", "gather_qmm", "fused_partitions", "quantize_activations"}
)


@dataclass(frozen=True)
class Platform:
    """What a vendor backend found on this machine.

    Attributes:
        ok: whether the kernels can run here.
        reason: why not (required when ``ok`` is false).
        device: a human description (``"NVIDIA H100 80GB HBM3, compute capability 9.0"``,
            or :data:`nvfp4_triton.INTERPRETER_DEVICE`). A certificate repeats it.
        torch_device: where tensors live (``"cuda:0"``, ``"cpu"`` for the interpreter).
        interpreter: Triton runs in its interpreter (``TRITON_INTERPRET=1``).
        arch: the architecture key of the config and dispatch tables (``"sm_90"``,
            ``"gfx942"``, ``"interpreter"``).
        capability: compute capability ``(major, minor)`` on NVIDIA, else ``None``.
        config: the tiles for this device.
        multiprocessors: SMs / CUs, when known (sizes split-K).
    """

    ok: bool
    reason: str = ""
    device: str = ""
    torch_device: str = "cpu"
    interpreter: bool = False
    arch: str = ""
    capability: tuple[int, int] | None = None
    config: KernelConfig | None = None
    multiprocessors: int | None = None


_DTYPE_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def torch_dtype(dtype: Any) -> Any:
    """An output dtype (torch dtype, numpy / ml_dtypes dtype or spec name) as a torch dtype
    among float32, float16, bfloat16; anything else is a ``ValueError``."""
    import torch

    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if isinstance(dtype, torch.dtype):
        if dtype in table.values():
            return dtype
    else:
        from nvfp4.dtypes import dtype_name

        try:
            return table[dtype_name(dtype)]
        except ValueError:
            pass
    raise ValueError(f"output dtype: expected float32, float16 or bfloat16, found {dtype!r}")


class TritonBackend:
    """The backend contract over :mod:`nvfp4_triton.ops`; see the module docstring for what
    a subclass supplies."""

    NAME = "triton"
    PRIORITY = 0
    PACKAGE = "nvfp4-triton"
    VERSION = ""
    NOTES: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._platform: Platform | None = None
        self._info: BackendInfo | None = None

    # ------------------------------------------------------------ subclass hooks
    def detect(self) -> Platform:
        """Find the device. Must not raise (return ``Platform(False, reason)``)."""
        raise NotImplementedError

    def qmm_path(self, m: int, n: int, k: int, x_dtype: Any, platform: Platform) -> str:
        """The W4A16 path for an ``[m, k] x [n, k]^T`` product (one of ``ops.QMM_PATHS``)."""
        return "gemv" if m <= 16 else "gemm"

    def gather_path(
        self, m: int, n: int, k: int, experts: int, sorted_indices: bool, platform: Platform
    ) -> str:
        """The MoE path (``"rows"`` or ``"grouped"``)."""
        return "grouped" if sorted_indices or m > 16 else "rows"

    def w4a4_supported(self, platform: Platform) -> bool:
        """Whether a native W4A4 GEMM runs on this platform."""
        return False

    def w4a4_matmul(
        self, x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, platform: Platform
    ) -> Any:
        """The native W4A4 GEMM (only called when :meth:`w4a4_supported`)."""
        raise NotImplementedError

    def platform_notes(self, platform: Platform) -> tuple[str, ...]:
        """Facts for the certificate beyond :attr:`NOTES`."""
        return ()

    # -------------------------------------------------------------------- facts
    def platform(self) -> Platform:
        """The detected platform (cached; never raises)."""
        if self._platform is None:
            try:
                self._platform = self.detect()
            except Exception as exc:  # detection must never take the registry down
                self._platform = Platform(
                    False, f"device detection failed: {type(exc).__name__}: {exc}"
                )
        return self._platform

    @property
    def info(self) -> BackendInfo:
        """Static facts; the capabilities depend on the device (``w4a4`` only where a native
        W4A4 GEMM exists), so they are computed on first access."""
        if self._info is None:
            p = self.platform()
            caps = set(BASE_CAPABILITIES)
            if p.ok and self.w4a4_supported(p):
                caps.add("w4a4")
            self._info = BackendInfo(
                name=self.NAME,
                spec_versions=SUPPORTED_SPEC_VERSIONS,
                priority=self.PRIORITY,
                capabilities=frozenset(caps),
                version=self.VERSION,
                package=self.PACKAGE,
                notes=(*self.NOTES, *self.platform_notes(p)),
            )
        return self._info

    def availability(self) -> Availability:
        p = self.platform()
        if not p.ok:
            return Availability(False, p.reason or "unavailable")
        return Availability(True, device=p.device)

    def _ready(self) -> tuple[Platform, KernelConfig]:
        p = self.platform()
        if not p.ok or p.config is None:
            raise RuntimeError(f"NVFP4 backend {self.NAME!r} cannot run here: {p.reason}")
        return p, p.config

    # ------------------------------------------------------------ conversions
    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        """A numpy array as a torch tensor on the device (bfloat16 from ``ml_dtypes``)."""
        import ml_dtypes
        import torch

        p = self.platform()
        arr = np.ascontiguousarray(a)
        if not arr.flags.writeable:  # torch.from_numpy warns on read-only memory
            arr = arr.copy()
        if arr.dtype == np.dtype(ml_dtypes.bfloat16):
            t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(arr)
        return t.to(p.torch_device)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        """A tensor as numpy, dtype preserved (bfloat16 as ``ml_dtypes.bfloat16``)."""
        import ml_dtypes
        import torch

        if isinstance(a, torch.Tensor):
            t = a.detach().cpu()
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            return t.numpy()
        return np.asarray(a)

    def _tensor(self, a: Any, p: Platform) -> Any:
        import torch

        if isinstance(a, torch.Tensor):
            return a if str(a.device) == str(torch.device(p.torch_device)) else a.to(p.torch_device)
        if isinstance(a, np.ndarray):
            return self.from_numpy(a)
        raise ValueError(f"expected a torch.Tensor or numpy array, found {type(a).__name__}")

    def _x(self, x: Any, w: DeviceWeight, p: Platform, what: str) -> tuple[Any, tuple[int, ...]]:
        """x as a contiguous 2-D tensor ``[M, K]`` and its leading shape."""
        import torch

        t = self._tensor(x, p)
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"{what}({w.name!r}): x must be float32, float16 or bfloat16, found {t.dtype}"
            )
        if t.ndim < 1 or t.shape[-1] != w.k:
            raise ValueError(
                f"{what}({w.name!r}): x must be [..., K] with K = {w.k}, found shape "
                f"{tuple(t.shape)}"
            )
        lead = tuple(t.shape[:-1])
        return t.reshape(-1, w.k).contiguous(), lead

    def _weight(self, w: Any) -> DeviceWeight:
        """A prepared weight, or raw planes validated (structure, then content) and moved."""
        if isinstance(w, DeviceWeight):
            return w
        return self.prepare(w)

    def _out_dtype(self, x: Any, out_dtype: Any) -> Any:
        return x.dtype if out_dtype is None else torch_dtype(out_dtype)

    # ------------------------------------------------------------------- verbs
    def prepare(self, planes: NVFP4Planes) -> DeviceWeight:
        """Validate (structure and content) and move the planes to the device once."""
        validate(planes)  # structure first: a malformed plane is refused before any copy
        p, _ = self._ready()
        return upload(planes, p.torch_device)

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> Any:
        dw = self._weight(w)
        p, cfg = self._ready()
        if dw.num_experts is not None:
            raise ValueError(f"qmm({dw.name!r}): expert-stacked weights go through gather_qmm")
        x2, lead = self._x(x, dw, p, "qmm")
        out = self._out_dtype(x2, out_dtype)
        path = self.qmm_path(x2.shape[0], dw.n, dw.k, x2.dtype, p)
        y = ops.qmm(x2, dw, out, cfg, path)
        return y.reshape(*lead, dw.n)

    def gather_qmm(
        self,
        x: Any,
        w: Any,
        expert_ids: Any,
        *,
        sorted_indices: bool = False,
        out_dtype: Any = None,
    ) -> Any:
        import torch

        dw = self._weight(w)
        p, cfg = self._ready()
        if dw.num_experts is None:
            raise ValueError(
                f"gather_qmm({dw.name!r}): weights must be [E, N, K], found {dw.shape}"
            )
        x2, lead = self._x(x, dw, p, "gather_qmm")
        if len(lead) != 1:
            raise ValueError(
                f"gather_qmm({dw.name!r}): x must be [M, K], found shape {(*lead, dw.k)}"
            )
        ids = self._tensor(expert_ids, p)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise ValueError(
                f"gather_qmm({dw.name!r}): expert_ids must be integers, found {ids.dtype}"
            )
        if tuple(ids.shape) != (x2.shape[0],):
            raise ValueError(
                f"gather_qmm({dw.name!r}): expert_ids must be [M] with M = {x2.shape[0]}, "
                f"found {tuple(ids.shape)}"
            )
        out = self._out_dtype(x2, out_dtype)
        path = self.gather_path(x2.shape[0], dw.n, dw.k, dw.num_experts, sorted_indices, p)
        return ops.gather(x2, dw, ids, out, cfg, path=path, sorted_indices=sorted_indices)

    def dequantize(self, w: Any, dtype: Any = "float32") -> Any:
        dw = self._weight(w)
        _, cfg = self._ready()
        return ops.dequantize(dw, torch_dtype(dtype), cfg)

    def quantize_activations(self, x: Any, input_scale: Any = None) -> NVFP4Planes:
        """Activation planes (linear scales), bit-exact to the reference encoder."""
        import torch

        p, cfg = self._ready()
        t = self._tensor(x, p)
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"quantize_activations: x must be float32, float16 or bfloat16, found {t.dtype}"
            )
        if t.ndim != 2:
            raise ValueError(f"quantize_activations: x must be [M, K], found {tuple(t.shape)}")
        k = t.shape[1]
        if k == 0 or k % 16:
            raise ValueError(
                f"quantize_activations: K must be a positive multiple of 16, found {k}"
            )
        g = ops.activation_global(t, input_scale)
        g_host = np.float32(g.item())  # finite and > 0 by construction
        codes, scales = ops.quantize_activations(t.contiguous(), g, cfg)
        return NVFP4Planes(
            codes.cpu().numpy(),
            scales.cpu().numpy(),
            np.asarray(g_host, dtype=np.float32),
            name="activation",
        )

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: Any = None, out_dtype: Any = None) -> Any:
        dw = self._weight(w)
        p, _ = self._ready()
        if not self.w4a4_supported(p):
            raise NotImplementedError(
                f"NVFP4 backend {self.NAME!r}: W4A4 needs a native FP4 GEMM, which "
                f"{p.device or 'this device'} does not have (capability 'w4a4' not declared)"
            )
        if dw.num_experts is not None:
            raise ValueError(f"qmm_w4a4({dw.name!r}): expert-stacked weights are not supported")
        x2, lead = self._x(x, dw, p, "qmm_w4a4")
        out = self._out_dtype(x2, out_dtype)
        y = self.w4a4_matmul(x2, dw, input_scale, out, p)
        return y.reshape(*lead, dw.n)

    def to_planes(self, w: DeviceWeight) -> NVFP4Planes:
        """The canonical planes of a prepared weight, byte for byte."""
        return w.to_planes()
