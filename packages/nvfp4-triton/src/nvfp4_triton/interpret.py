"""Whether Triton runs in its interpreter (``TRITON_INTERPRET=1``), without importing it.

Under the interpreter every kernel runs on the CPU with numpy, program after program, on
torch CPU tensors: slow, but the same kernel source as on a GPU, which is how CI certifies
the kernels' logic. The variable must be set before triton is imported.
"""

from __future__ import annotations

import os

__all__ = ["INTERPRETER_DEVICE", "interpreter_mode"]

#: The device string a backend reports (and a certificate repeats) in interpreter mode.
INTERPRETER_DEVICE = "Triton interpreter on CPU"


def interpreter_mode() -> bool:
    """True when ``TRITON_INTERPRET`` is set to a true value (``1``, ``true``, ``on``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
