"""Run-time choices read from the environment (no MLX import here).

=========================== ===================== =============================================
variable                    values                effect
=========================== ===================== =============================================
``NVFP4_METAL_IMPL``        ``native`` (default), ``native``: NVFP4 bytes as they are, MLX's
                            ``affine``            ``nvfp4`` kernels, the global as a sidecar.
                                                  ``affine``: the comparison rollback - decode
                                                  densely (exact float32, global included), cast
                                                  to bfloat16, re-quantize with
                                                  ``mx.quantize(mode="affine", bits=4)``, group
                                                  64 (32 when K % 64 != 0), scales and biases
                                                  kept as float32. Lossy: a backend in
                                                  this mode declares no capability.
``NVFP4_METAL_W4A4``        ``0`` (default), ``1`` ``1`` declares the ``w4a4`` capability where
                                                  MLX's ``mx.qqmm`` takes global scales (the
                                                  Metal GPU). Off by default: that path has not
                                                  been certified on Apple hardware by this
                                                  project. Never declared on MLX's CPU device,
                                                  whose ``qqmm`` ignores global scales.
=========================== ===================== =============================================
"""

from __future__ import annotations

import os
from typing import Final, Literal

__all__ = ["IMPLS", "IMPL_ENV", "W4A4_ENV", "Impl", "impl_from_env", "resolve_impl", "w4a4_opt_in"]

Impl = Literal["native", "affine"]
#: Every implementation, the default first.
IMPLS: Final[tuple[Impl, ...]] = ("native", "affine")
IMPL_ENV: Final = "NVFP4_METAL_IMPL"
W4A4_ENV: Final = "NVFP4_METAL_W4A4"


def resolve_impl(value: str | None) -> Impl:
    """``"native"`` or ``"affine"``; ``None`` or ``""`` means ``"native"``. Anything else is
    refused with a ValueError naming the allowed values."""
    if value is None or value.strip() == "":
        return "native"
    v = value.strip().lower()
    if v == "native":
        return "native"
    if v == "affine":
        return "affine"
    raise ValueError(f"{IMPL_ENV}: expected one of {', '.join(IMPLS)}, found {value!r}")


def impl_from_env() -> Impl:
    """The implementation ``$NVFP4_METAL_IMPL`` selects (``native`` when unset)."""
    return resolve_impl(os.environ.get(IMPL_ENV))


def w4a4_opt_in() -> bool:
    """Whether ``$NVFP4_METAL_W4A4`` is ``1`` (or ``true`` / ``yes``)."""
    return os.environ.get(W4A4_ENV, "").strip().lower() in ("1", "true", "yes")
