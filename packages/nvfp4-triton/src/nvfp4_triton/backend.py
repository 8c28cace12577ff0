"""The kernel contract (:mod:`nvfp4.contract`) over the shared Triton kernels.

:class:`TritonKernels` implements every kernel once, for every GPU vendor: the dtype names,
the device placement, the conversions to and from numpy, and the calls into
:mod:`nvfp4_triton.ops` (core's :class:`nvfp4.Frontend` has checked every argument before).
A vendor backend (``nvfp4-cuda``, ``nvfp4-rocm``) subclasses it and supplies only what
differs between vendors:

* :meth:`TritonKernels.detect` - the :class:`Platform`: is there a usable device (or the
  interpreter), what it is called, which :class:`~nvfp4_triton.config.KernelConfig` fits it;
* :meth:`TritonKernels.qmm_path` / :meth:`TritonKernels.gather_path` - its dispatch table;
* :meth:`TritonKernels.w4a4_supported` / :meth:`TritonKernels.w4a4_matmul` - a native W4A4
  GEMM where the hardware has one (the ``w4a4`` capability is declared only then);
* :meth:`TritonKernels.w4a8_supported` / :meth:`TritonKernels.w4a8_fp8_supported` - whether
  the device has the int8 / FP8 tensor cores the shared W4A8 kernels need (``w4a8`` and
  ``w4a8_fp8``, spec 1.1, are declared only then; both run under the interpreter);
* the class attributes ``NAME``, ``PRIORITY``, ``PACKAGE``, ``NOTES`` and ``SPEC_VERSIONS``
  (the spec versions that platform is certified for, as literals; none by default, so a
  platform that names none is refused by the registry).

:class:`TritonBackend` is core's :class:`nvfp4.Frontend` over a subclass's kernels, so a
vendor backend names only its ``KERNELS`` class.

Native arrays are torch tensors on the platform's device (CPU tensors under the
interpreter); a tensor on another device is moved there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.backend import Frontend
from nvfp4.contract import Availability, BackendInfo
from nvfp4.frontend import decode_dtype
from nvfp4.planes import NVFP4Planes

from . import hardware, ops
from .config import KernelConfig
from .weights import DeviceWeight, host_array, upload

__all__ = ["BASE_CAPABILITIES", "Platform", "TritonBackend", "TritonKernels", "torch_dtype"]

#: Capabilities every Triton backend has (``w4a4`` is added where it is native, ``w4a8`` /
#: ``w4a8_fp8`` where the device has int8 / FP8 tensor cores, or under the interpreter).
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


def torch_dtype(dtype: Any) -> Any:
    """An output dtype (a spec name, a numpy / ml_dtypes or torch dtype) as a torch dtype
    among float32, float16, bfloat16; anything else is core's one ``ValueError``."""
    import torch

    return getattr(torch, decode_dtype(dtype))


class TritonKernels:
    """The kernel contract (:mod:`nvfp4.contract`) over :mod:`nvfp4_triton.ops`; see the
    module docstring for what a subclass supplies."""

    NAME = "triton"
    PRIORITY = 0
    PACKAGE = "nvfp4-triton"
    VERSION = ""
    NOTES: tuple[str, ...] = ()
    #: The spec versions a platform is certified for, named by each subclass (never
    #: ``nvfp4.SUPPORTED_SPEC_VERSIONS``: a newer nvfp4-core must not widen the claim).
    SPEC_VERSIONS: tuple[str, ...] = ()
    #: Where ``w4a8`` is declared and what ``w4a8_fp8`` needs, in a vendor's words (the
    #: certificate's note on a device without them, from :meth:`w4a8_notes`).
    W4A8_DECLARED_ON = "int8 tensor cores"
    W4A8_FP8_NEEDS = "FP8 tensor cores"

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

    def w4a8_supported(self, platform: Platform) -> bool:
        """Whether the W4A8 int8 kernels (an int8 ``tl.dot``) run on this platform: the
        interpreter here; a vendor says which GPUs have int8 tensor cores."""
        return platform.interpreter

    def w4a8_fp8_supported(self, platform: Platform) -> bool:
        """Whether the W4A8 FP8 kernels (an FP8 ``tl.dot``) run on this platform: the
        interpreter here; a vendor says which GPUs have FP8 tensor cores. Never emulated
        on a GPU without them."""
        return platform.interpreter

    def platform_notes(self, platform: Platform) -> tuple[str, ...]:
        """Facts for the certificate beyond :attr:`NOTES`."""
        return ()

    def w4a8_notes(self, platform: Platform) -> tuple[str, str]:
        """The certificate's two W4A8 notes (int8, FP8): what the kernels do where they are
        declared, else where they would be (:attr:`W4A8_DECLARED_ON`,
        :attr:`W4A8_FP8_NEEDS`); neither is ever emulated."""
        int8 = (
            hardware.W4A8_NOTE
            if self.w4a8_supported(platform)
            else f"W4A8 (int8) not declared on {platform.arch}: declared on {self.W4A8_DECLARED_ON}"
        )
        fp8 = (
            hardware.W4A8_FP8_NOTE
            if self.w4a8_fp8_supported(platform)
            else f"W4A8 FP8 not declared on {platform.arch}: it needs {self.W4A8_FP8_NEEDS}; "
            "not emulated"
        )
        return int8, fp8

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
            if p.ok and self.w4a8_supported(p):
                caps.add("w4a8")
            if p.ok and self.w4a8_fp8_supported(p):
                caps.add("w4a8_fp8")
            self._info = BackendInfo(
                name=self.NAME,
                spec_versions=self.SPEC_VERSIONS,
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
        arr = host_array(a)
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

    @staticmethod
    def _on(a: Any, p: Platform) -> Any:
        """A caller's tensor on the platform's device (core checked everything else)."""
        import torch

        device = torch.device(p.torch_device)
        return a if a.device == device else a.to(device)

    # ----------------------------------------------------------------- kernels
    def prepare(self, planes: NVFP4Planes) -> DeviceWeight:
        """Move the (validated) planes to the device once."""
        p, _ = self._ready()
        return upload(planes, p.torch_device)

    def qmm(self, x: Any, w: DeviceWeight, *, out_dtype: str) -> Any:
        p, cfg = self._ready()
        x = self._on(x, p)
        path = self.qmm_path(x.shape[0], w.n, w.k, x.dtype, p)
        return ops.qmm(x, w, torch_dtype(out_dtype), cfg, path)

    def gather_qmm(
        self,
        x: Any,
        w: DeviceWeight,
        expert_ids: Any,
        *,
        sorted_indices: bool,
        out_dtype: str,
    ) -> Any:
        p, cfg = self._ready()
        x = self._on(x, p)
        assert w.num_experts is not None  # core sends expert stacks only
        path = self.gather_path(x.shape[0], w.n, w.k, w.num_experts, sorted_indices, p)
        return ops.gather(
            x,
            w,
            self._on(expert_ids, p),
            torch_dtype(out_dtype),
            cfg,
            path=path,
            sorted_indices=sorted_indices,
        )

    def dequantize(self, w: DeviceWeight, *, dtype: str) -> Any:
        _, cfg = self._ready()
        return ops.dequantize(w, torch_dtype(dtype), cfg)

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        """Activation planes (linear scales), bit-exact to the reference encoder."""
        p, cfg = self._ready()
        t = self._on(x, p)
        g = ops.activation_global(t, input_scale)
        g_host = np.float32(g.item())  # finite and > 0 by construction
        codes, scales = ops.quantize_activations(t, g, cfg)
        return NVFP4Planes(
            codes.cpu().numpy(),
            scales.cpu().numpy(),
            np.asarray(g_host, dtype=np.float32),
            name="activation",
        )

    def qmm_w4a4(
        self, x: Any, w: DeviceWeight, *, input_scale: float | None, out_dtype: str
    ) -> Any:
        """The native W4A4 GEMM (core calls it only where ``w4a4`` is declared)."""
        p, _ = self._ready()
        return self.w4a4_matmul(self._on(x, p), w, input_scale, torch_dtype(out_dtype), p)

    # ------------------------------------------------------------------- W4A8
    def _w4a8_ready(self, fp8: bool) -> tuple[Platform, KernelConfig]:
        """The platform, refusing a W4A8 kernel it does not support (core calls them only
        where declared; a direct caller gets the same answer, never an emulation)."""
        p, cfg = self._ready()
        ok = self.w4a8_fp8_supported(p) if fp8 else self.w4a8_supported(p)
        if not ok:
            cap = "w4a8_fp8" if fp8 else "w4a8"
            kind = "FP8" if fp8 else "int8"
            raise NotImplementedError(
                f"NVFP4 backend {self.NAME!r}: {cap} needs {kind} tensor cores, which "
                f"{p.device or p.arch} does not have"
            )
        return p, cfg

    def quantize_activations_q8(self, x: Any) -> Q8Activations:
        """int8 W4A8 activations (ggml Q8_0), bit-identical to the reference's."""
        p, cfg = self._w4a8_ready(fp8=False)
        codes, d = ops.quantize_q8(self._on(x, p), cfg)
        return Q8Activations(codes.cpu().numpy(), d.cpu().numpy(), name="activation")

    def qmm_w4a8(self, x: Any, w: DeviceWeight, *, out_dtype: str) -> Any:
        p, cfg = self._w4a8_ready(fp8=False)
        return ops.w4a8(self._on(x, p), w, torch_dtype(out_dtype), cfg)

    def gather_qmm_w4a8(
        self,
        x: Any,
        w: DeviceWeight,
        expert_ids: Any,
        *,
        sorted_indices: bool,
        out_dtype: str,
    ) -> Any:
        p, cfg = self._w4a8_ready(fp8=False)
        return ops.gather_w4a8(
            self._on(x, p),
            w,
            self._on(expert_ids, p),
            torch_dtype(out_dtype),
            cfg,
            sorted_indices=sorted_indices,
        )

    def quantize_activations_fp8(self, x: Any, *, input_scale: float | None) -> FP8Activations:
        """FP8 E4M3 W4A8 activations and their scale, bit-identical to the reference's."""
        p, cfg = self._w4a8_ready(fp8=True)
        t = self._on(x, p)
        s = ops.fp8_input_scale(t, input_scale)
        codes = ops.quantize_fp8(t, s, cfg)
        scale = np.asarray(np.float32(s.item()), dtype=np.float32)  # finite and > 0
        return FP8Activations(codes.cpu().numpy(), scale, name="activation")

    def qmm_w4a8_fp8(
        self, x: Any, w: DeviceWeight, *, input_scale: float | None, out_dtype: str
    ) -> Any:
        p, cfg = self._w4a8_ready(fp8=True)
        return ops.w4a8_fp8(self._on(x, p), w, input_scale, torch_dtype(out_dtype), cfg)

    def to_planes(self, w: DeviceWeight) -> NVFP4Planes:
        """The canonical planes of a prepared weight, byte for byte."""
        return w.to_planes()


class TritonBackend(Frontend):
    """Core's verbs (:class:`nvfp4.Frontend`) over a vendor's :class:`TritonKernels`
    subclass, ``KERNELS``; ``platform()`` and the other facts of the kernels read through."""

    KERNELS: ClassVar[type[TritonKernels]]

    def __init__(self) -> None:
        super().__init__(self.KERNELS())
