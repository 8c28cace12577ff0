"""MLX, imported lazily: whether it is here, which device it runs on, and what it can do.

Nothing in this module imports MLX at import time; :func:`probe` does, once, and remembers
the answer (or the reason MLX cannot run).
"""

from __future__ import annotations

import functools
import platform
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Final

__all__ = ["MIN_MLX", "MLXProbe", "MLXUnavailable", "is_apple_silicon", "probe", "require"]

#: The oldest MLX with ``mode="nvfp4"`` in quantize / quantized_matmul / gather_qmm.
MIN_MLX: Final = (0, 30)


class MLXUnavailable(RuntimeError):
    """MLX cannot run here; the message says why and what to install."""


def is_apple_silicon() -> bool:
    """macOS on arm64: where MLX runs on the Metal GPU (no import needed)."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _install_hint() -> str:
    if sys.platform == "darwin":
        return "pip install 'mlx>=0.30' (Apple silicon, macOS 14+)"
    if sys.platform.startswith("linux"):
        return "pip install 'mlx[cpu]>=0.30' (MLX's CPU device on Linux, glibc >= 2.35)"
    return "MLX has no wheels for this platform (macOS on Apple silicon or Linux only)"


@dataclass(frozen=True)
class MLXProbe:
    """What :func:`probe` found.

    Attributes:
        ok: MLX imports, is recent enough and runs an ``nvfp4`` matmul.
        reason: why not (with what to install), when ``ok`` is false.
        version: ``mlx.core.__version__`` (empty when it did not import).
        device: the default device in words: ``"Apple Metal GPU (Apple M2 Max)"``,
            ``"MLX CUDA GPU (...)"`` or ``"MLX CPU device (Linux x86_64, Intel(R) Xeon(R))"``.
        kind: ``"metal"``, ``"cuda"`` or ``"cpu"``.
    """

    ok: bool
    reason: str = ""
    version: str = ""
    device: str = ""
    kind: str = ""


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _describe_device(mx: ModuleType) -> tuple[str, str]:
    info: dict[str, object] = {}
    try:
        info = dict(mx.device_info())
    except Exception:  # older MLX: no device_info
        info = {}
    name = str(info.get("device_name", "") or platform.processor() or platform.machine())
    default = mx.default_device()
    if default.type == mx.gpu:
        metal = getattr(mx, "metal", None)
        if metal is not None and metal.is_available():
            return "metal", f"Apple Metal GPU ({name})"
        return "cuda", f"MLX CUDA GPU ({name})"
    system = {"darwin": "macOS", "linux": "Linux"}.get(sys.platform, sys.platform)
    return "cpu", f"MLX CPU device ({system} {platform.machine()}, {name})"


@functools.lru_cache(maxsize=1)
def probe() -> MLXProbe:
    """Import MLX, check its version, and run one tiny ``nvfp4`` matmul on the default
    device. Never raises; the result is cached for the process."""
    try:
        import mlx.core as mx
    except Exception as exc:
        return MLXProbe(
            False, f"MLX does not import ({type(exc).__name__}: {exc}); {_install_hint()}"
        )
    version = str(getattr(mx, "__version__", ""))
    if _version_tuple(version) < MIN_MLX:
        need = ".".join(map(str, MIN_MLX))
        return MLXProbe(
            False,
            f"MLX {version} has no mode='nvfp4'; MLX >= {need} is needed: {_install_hint()}",
            version,
        )
    try:
        kind, device = _describe_device(mx)
        x = mx.ones((1, 16), dtype=mx.float32)
        w = mx.zeros((1, 2), dtype=mx.uint32)
        s = mx.full((1, 1), 0x38, dtype=mx.uint8)
        y = mx.quantized_matmul(x, w, s, transpose=True, group_size=16, bits=4, mode="nvfp4")
        mx.eval(y)
    except Exception as exc:
        return MLXProbe(
            False,
            f"MLX {version} imports but cannot run an nvfp4 matmul here "
            f"({type(exc).__name__}: {exc}); {_install_hint()}",
            version,
        )
    return MLXProbe(True, "", version, device, kind)


def require() -> ModuleType:
    """``mlx.core``, or :class:`MLXUnavailable` saying why it cannot run here."""
    p = probe()
    if not p.ok:
        raise MLXUnavailable(p.reason)
    import mlx.core as mx

    return mx
