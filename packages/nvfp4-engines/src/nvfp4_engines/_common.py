"""What every engine adapter shares: the installed engine's version (read from its
distribution's metadata, so nothing heavy is imported), the ``BackendInfo`` of an adapter
with the engine named in a note the engines matrix reads back (built by
:class:`EngineKernels` from the facts an adapter declares), the availability probe of a
CPU engine and the error a kernel raises where its engine cannot run, and numpy array
conversion for the engines whose arrays are numpy's.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt
from nvfp4.contract import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes, validate

from ._version import __version__

__all__ = [
    "ENGINE_NOTE",
    "PRIORITY",
    "SPEC_VERSIONS",
    "EngineKernels",
    "activation_planes",
    "adapter_info",
    "cached_probe",
    "dist_version",
    "engine_note",
    "numpy_in",
    "numpy_out",
    "probe_engine",
    "require",
]

#: Below the reference backend's 0: an engine adapter is certified by name, never chosen by
#: ``nvfp4.get_backend()`` on its own.
PRIORITY: Final = -100
#: The NVFP4 spec versions the adapters are certified for, named here: never
#: ``nvfp4.SUPPORTED_SPEC_VERSIONS``, which would make an adapter claim every version a newer
#: nvfp4-core adds. A version is added here when an adapter passes its conformance run.
SPEC_VERSIONS: Final[tuple[str, ...]] = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5")

#: The first note of every adapter starts with this; the engines matrix reads the engine and
#: its version from it (``"engine: gguf 0.19.0"``).
ENGINE_NOTE: Final = "engine: "


def dist_version(distribution: str) -> str:
    """The installed version of ``distribution``, or ``""`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def engine_note(distribution: str) -> str:
    """``"engine: <distribution> <version>"`` (``not installed`` in place of a version)."""
    return f"{ENGINE_NOTE}{distribution} {dist_version(distribution) or 'not installed'}"


def adapter_info(
    name: str, distribution: str, capabilities: frozenset[str], notes: tuple[str, ...]
) -> BackendInfo:
    """The ``BackendInfo`` of the adapter ``name`` over the engine ``distribution``."""
    return BackendInfo(
        name=name,
        spec_versions=SPEC_VERSIONS,
        priority=PRIORITY,
        capabilities=capabilities,
        version=__version__,
        package="nvfp4-engines",
        notes=(engine_note(distribution), *notes),
    )


class EngineKernels:
    """The start of an adapter's kernels object: the class declares the adapter's ``NAME``,
    its engine's ``DISTRIBUTION``, the ``CAPABILITIES`` and the ``NOTES`` of its
    certificate; :attr:`info` is their :func:`adapter_info`, built at construction (when
    the engine's version is read). :meth:`availability` is the adapter's ``probe`` (a CPU
    engine's :func:`cached_probe`, the one its kernels :func:`require`); a subclass
    without one supplies :meth:`availability` itself."""

    NAME: ClassVar[str]
    DISTRIBUTION: ClassVar[str]
    CAPABILITIES: ClassVar[frozenset[str]]
    NOTES: ClassVar[tuple[str, ...]]
    probe: ClassVar[staticmethod[[], Availability]]

    def __init__(self) -> None:
        self.info = adapter_info(self.NAME, self.DISTRIBUTION, self.CAPABILITIES, self.notes())

    def notes(self) -> tuple[str, ...]:
        """The certificate's notes after the engine's: :attr:`NOTES`."""
        return self.NOTES

    def availability(self) -> Availability:
        return self.probe()


def probe_engine(
    engine: str, distribution: str, install: str, what: str, check: Callable[[], str]
) -> Availability:
    """Availability of an engine that runs on this machine's CPU: not installed, or
    ``check()`` (the engine's own smallest NVFP4 call, returning the device it ran on) fails
    (``"<engine> cannot run <what> here (<error>): <install>"``), or available on that
    device. The engine is imported only by ``check``, and only where it is installed."""
    if not dist_version(distribution):
        return Availability(False, f"{engine} is not installed: {install}")
    try:
        device = check()
    except Exception as exc:
        return Availability(
            False, f"{engine} cannot run {what} here ({type(exc).__name__}: {exc}): {install}"
        )
    return Availability(True, device=device)


def cached_probe(
    engine: str, distribution: str, install: str, what: str, check: Callable[[], str]
) -> Callable[[], Availability]:
    """:func:`probe_engine` as a function that answers once per process (an engine's import
    and first call take seconds); its ``cache_clear()`` makes it ask again."""

    @functools.lru_cache(maxsize=1)
    def probe() -> Availability:
        return probe_engine(engine, distribution, install, what, check)

    return probe


def require(name: str, availability: Availability) -> None:
    """Raise the error every kernel of the adapter ``name`` raises where its engine cannot
    run: ``NVFP4 backend '<name>' cannot run here: <reason>``."""
    if not availability.ok:
        raise RuntimeError(f"NVFP4 backend {name!r} cannot run here: {availability.reason}")


def numpy_in(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A numpy engine's native array: the array itself."""
    return np.asarray(a)


def numpy_out(a: Any) -> npt.NDArray[Any]:
    """Back to numpy (dtype preserved)."""
    return np.asarray(a)


def activation_planes(codes: Any, scales: Any, decode_global: Any) -> NVFP4Planes:
    """An engine's quantized activations in the canonical layout (codes ``[M, K/2]``, E4M3
    scale bytes ``[M, K/16]``, the decode global) as planes named ``activation``, bytes
    unchanged. Only the structure is checked: the content (a NaN block's scale byte 0x7F,
    a zero or non-finite global) is the engine's answer, for the suite to judge against
    the reference, not for the transcoder to refuse."""
    planes = NVFP4Planes(
        codes=np.ascontiguousarray(codes, dtype=np.uint8),
        scales=np.ascontiguousarray(np.asarray(scales).view(np.uint8)),
        global_scale=np.asarray(decode_global, dtype=np.float32).reshape(()),
        name="activation",
    )
    return validate(planes)
