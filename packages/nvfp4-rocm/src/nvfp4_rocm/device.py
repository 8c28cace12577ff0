"""Finding the AMD GPU (or the Triton interpreter): :func:`detect`.

* ``TRITON_INTERPRET=1``: the kernels run on the CPU under Triton's interpreter, on torch
  CPU tensors, with the tiles of one AMD architecture: ``$NVFP4_ROCM_ARCH`` (a ``gfx``
  name, default ``gfx942``), so a CDNA (64-lane) or an RDNA (32-lane) configuration can be
  certified on any machine. The device string starts with exactly
  :data:`nvfp4_triton.INTERPRETER_DEVICE` ("Triton interpreter on CPU") and names the AMD
  configuration - never a GPU.
* otherwise: a ROCm build of torch (``torch.version.hip``), a visible GPU, its
  architecture from ``torch.cuda.get_device_properties(i).gcnArchName`` (``gfx942``,
  ``gfx950``, ``gfx1100``, ``gfx1201``...) resolved by :func:`nvfp4_rocm.configs.match_arch`,
  and triton importable.

A CUDA build of torch, a CPU-only build, no visible GPU or an architecture the kernels do
not target is an unavailable :class:`~nvfp4_triton.backend.Platform` whose reason says what
to do; nothing here raises.
"""

from __future__ import annotations

import os

from nvfp4.hardware import driver_evidence
from nvfp4_triton.backend import Platform
from nvfp4_triton.interpret import INTERPRETER_DEVICE, interpreter_mode

from . import configs

__all__ = ["ARCH_ENV", "DEFAULT_INTERPRETER_ARCH", "detect"]

#: Which AMD architecture's tiles the interpreter runs.
ARCH_ENV = "NVFP4_ROCM_ARCH"
#: The interpreter's architecture when ``$NVFP4_ROCM_ARCH`` is unset (CDNA3, MI300X).
DEFAULT_INTERPRETER_ARCH = "gfx942"

_INTERPRET_HINT = (
    "set TRITON_INTERPRET=1 to run the kernels on the CPU under the Triton interpreter"
)
_VISIBILITY_ENVS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _interpreter() -> Platform:
    arch = os.environ.get(ARCH_ENV, "").strip() or DEFAULT_INTERPRETER_ARCH
    try:
        match = configs.match_arch(arch)
    except ValueError as exc:
        return Platform(False, f"${ARCH_ENV}={arch!r}: {exc}")
    cfg = configs.config_for(arch, interpreter=True)
    return Platform(
        True,
        device=(
            f"{INTERPRETER_DEVICE} (AMD configuration {cfg.name}: {match.family.title}, "
            f"{cfg.lanes}-lane wavefronts)"
        ),
        torch_device="cpu",
        interpreter=True,
        arch=match.arch,
        config=cfg,
    )


def _not_rocm(torch_version: object) -> Platform:
    cuda = getattr(torch_version, "cuda", None)
    if cuda:
        return Platform(
            False,
            f"this torch is a CUDA build (CUDA {cuda}); install nvfp4-cuda for NVIDIA GPUs, "
            "or a ROCm build of torch for AMD GPUs",
        )
    return Platform(
        False,
        "this torch is a CPU-only build (neither ROCm nor CUDA): no GPU to run on; install a "
        f"ROCm build of torch for AMD GPUs, or {_INTERPRET_HINT}",
    )


def detect() -> Platform:
    """The platform the ``rocm`` backend runs on, or why it cannot run."""
    try:
        import torch
    except ImportError as exc:
        return Platform(False, f"torch is not installed ({exc}): install a ROCm build of torch")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return Platform(False, f"triton is not installed ({exc}): pip install triton")
    if interpreter_mode():
        return _interpreter()
    hip = getattr(torch.version, "hip", None)
    if not hip:
        driver = driver_evidence("amd")
        if driver:
            return Platform(
                False,
                f"an AMD GPU driver is loaded ({driver}) but torch {torch.__version__} is not a "
                "ROCm build: install torch from PyTorch's ROCm wheel index (nox -s "
                "conformance-rocm does, from NVFP4_TORCH_INDEX_URL, unless TRITON_INTERPRET=1), "
                f"or {_INTERPRET_HINT}",
            )
        return _not_rocm(torch.version)
    if not torch.cuda.is_available():
        seen = "".join(f"; {v}={os.environ[v]!r}" for v in _VISIBILITY_ENVS if v in os.environ)
        return Platform(
            False, f"no AMD GPU visible to torch (ROCm {hip} build{seen}); {_INTERPRET_HINT}"
        )
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    name = str(getattr(props, "name", "AMD GPU"))
    gcn = str(getattr(props, "gcnArchName", "") or "")
    if not gcn:
        return Platform(
            False, f"{name}: torch does not report its architecture (gcnArchName is empty)"
        )
    try:
        match = configs.match_arch(gcn)
    except ValueError as exc:
        return Platform(False, f"{name}: {exc}; {_INTERPRET_HINT}")
    cus = int(props.multi_processor_count)
    return Platform(
        True,
        device=f"{name} ({match.arch}, {match.family.title}, {cus} CUs, ROCm {hip})",
        torch_device=f"cuda:{index}",
        arch=match.arch,
        config=configs.config_for(gcn, cus),
        multiprocessors=cus,
    )
