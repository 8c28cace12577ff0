"""Finding the NVIDIA GPU (or the Triton interpreter): :func:`detect`.

* ``TRITON_INTERPRET=1``: the kernels run on the CPU under Triton's interpreter, on torch
  CPU tensors. The device is reported as exactly :data:`nvfp4_triton.INTERPRETER_DEVICE`
  ("Triton interpreter on CPU") - never as a GPU, even when one is present.
* otherwise: a CUDA build of torch (``torch.version.hip`` unset: a ROCm build belongs to
  ``nvfp4-rocm``), a visible device of compute capability 8.0 or newer (bfloat16 tensor
  cores, which the prefill kernels use), and triton importable. The device string names the
  GPU, its compute capability and SM count.

Every failure is an unavailable :class:`~nvfp4_triton.backend.Platform` whose reason says
what is missing and what to do; nothing here raises.
"""

from __future__ import annotations

import os

from nvfp4.hardware import driver_evidence
from nvfp4_triton.backend import Platform
from nvfp4_triton.interpret import INTERPRETER_DEVICE, interpreter_mode

from .configs import INTERPRETER, config_for

__all__ = ["MIN_CAPABILITY", "detect"]

#: The oldest compute capability the kernels support.
MIN_CAPABILITY = (8, 0)

_INTERPRET_HINT = (
    "set TRITON_INTERPRET=1 to run the kernels on the CPU under the Triton interpreter"
)


def _imports() -> str:
    """'' when torch and triton import, else why not."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"torch is not installed ({exc}): pip install torch"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc}): pip install triton"
    return ""


def detect() -> Platform:
    """The platform the ``cuda`` backend runs on, or why it cannot run."""
    missing = _imports()
    if missing:
        return Platform(False, missing)
    import torch

    if interpreter_mode():
        return Platform(
            True,
            device=INTERPRETER_DEVICE,
            torch_device="cpu",
            interpreter=True,
            arch="interpreter",
            config=INTERPRETER,
        )
    if getattr(torch.version, "hip", None):
        return Platform(
            False,
            f"this torch is a ROCm build (HIP {torch.version.hip}): AMD GPUs use the 'rocm' "
            "backend (pip install nvfp4-rocm)",
        )
    cuda = getattr(torch.version, "cuda", None)
    driver = driver_evidence("nvidia")
    if not cuda and driver:
        return Platform(
            False,
            f"an NVIDIA driver is loaded ({driver}) but torch {torch.__version__} is a CPU-only "
            "build: install a CUDA build of torch (nox -s conformance-cuda takes one unless "
            f"TRITON_INTERPRET=1), or {_INTERPRET_HINT}",
        )
    if not torch.cuda.is_available():
        build = f"CUDA {cuda} build" if cuda else "CPU-only build (no CUDA)"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return Platform(False, f"no CUDA GPU visible to torch ({build}{seen}); {_INTERPRET_HINT}")
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    if (major, minor) < MIN_CAPABILITY:
        return Platform(
            False,
            f"{name} has compute capability {major}.{minor}; the kernels need "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (bfloat16 tensor cores); "
            f"{_INTERPRET_HINT}",
        )
    sms = int(torch.cuda.get_device_properties(index).multi_processor_count)
    return Platform(
        True,
        device=f"{name}, compute capability {major}.{minor}, {sms} SMs",
        torch_device=f"cuda:{index}",
        arch=f"sm_{major}{minor}",
        capability=(major, minor),
        config=config_for((major, minor), sms),
        multiprocessors=sms,
    )
