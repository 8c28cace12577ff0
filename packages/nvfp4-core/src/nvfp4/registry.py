"""Backend discovery (entry-point group ``nvfp4.backends``) and selection.

* :func:`discover` lists every installed backend, loaded or not, with its availability.
* :func:`get_backend` returns one: by name (argument, else ``$NVFP4_BACKEND``), or the
  available backend with the highest priority.

Asked for by name, a backend that is missing, fails to load, is unavailable here or
implements none of this core's spec versions is an error (:class:`BackendUnavailable`)
that says why and what to install. Chosen automatically, the best available one wins, with
a warning when this machine looks like it could run a better one that is not installed.
"""

from __future__ import annotations

import os
import platform
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .backend import Frontend
from .contract import Availability
from .hardware import driver_evidence
from .spec import SUPPORTED_SPEC_VERSIONS

__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN_PACKAGES",
    "BackendEntry",
    "BackendUnavailable",
    "discover",
    "get_backend",
]

#: The entry-point group backends register under.
ENTRY_POINT_GROUP = "nvfp4.backends"
#: Backends this project publishes, and the distribution that provides each.
KNOWN_PACKAGES: dict[str, str] = {
    "reference": "nvfp4-core",
    "cpu": "nvfp4-cpu",
    "cuda": "nvfp4-cuda",
    "rocm": "nvfp4-rocm",
    "metal": "nvfp4-metal",
}
#: Set to 1 to accept a backend whose spec versions do not intersect core's.
SKIP_VERSION_CHECK_ENV = "NVFP4_SKIP_VERSION_CHECK"


class BackendUnavailable(RuntimeError):
    """A backend asked for by name cannot be used here; the message says why."""

    def __init__(self, name: str, reason: str, installed: list[str]) -> None:
        self.name = name
        self.reason = reason
        self.installed = installed
        hint = ""
        if name in KNOWN_PACKAGES and name not in installed:
            package = KNOWN_PACKAGES[name]
            hint = (
                f" (it comes with `pip install {package}`; from a clone of the repository: "
                f"`nox -s build`, then `pip install --find-links dist {package}`)"
            )
        super().__init__(
            f"NVFP4 backend {name!r} is unavailable: {reason}{hint}. "
            f"Installed backends: {', '.join(installed) or 'none'}."
        )


@dataclass
class BackendEntry:
    """One installed backend: its factory, and the backend or the load error."""

    name: str
    source: str
    factory: Callable[[], Any] | None = None
    backend: Frontend | None = None
    error: str = ""

    def load(self) -> Frontend | None:
        """The core :class:`~nvfp4.Frontend` over the factory's kernels (made once), or
        ``None`` with :attr:`error` saying why."""
        if self.backend is None and not self.error and self.factory is not None:
            try:
                kernels = self.factory()
                if kernels is None:
                    self.error = f"loading {self.source} failed: its factory returned None"
                else:
                    self.backend = Frontend(kernels)
            except Exception as exc:  # a broken plugin must not take the others down
                self.error = f"loading {self.source} failed: {type(exc).__name__}: {exc}"
        return self.backend

    def availability(self) -> Availability:
        b = self.load()
        if b is None:
            return Availability(False, self.error or "not loaded")
        try:
            a = b.availability()
        except Exception as exc:
            return Availability(False, f"availability() raised {type(exc).__name__}: {exc}")
        if not isinstance(a, Availability):
            return Availability(
                False, f"availability() returned {type(a).__name__}, not Availability"
            )
        return a


def _reference_factory() -> Any:
    from .reference_backend import backend

    return backend()


def discover() -> dict[str, BackendEntry]:
    """Every installed backend, by name. ``reference`` is always present (core provides it
    even when run from a source tree without installed metadata)."""
    found: dict[str, BackendEntry] = {
        "reference": BackendEntry(
            "reference", "nvfp4.reference_backend:backend", _reference_factory
        )
    }
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == "reference":
            continue

        def factory(ep: Any = ep) -> Any:
            return ep.load()()

        found[ep.name] = BackendEntry(ep.name, ep.value, factory)
    return found


def _spec_ok(b: Any) -> str:
    versions = tuple(getattr(getattr(b, "info", None), "spec_versions", ()) or ())
    if (
        set(versions) & set(SUPPORTED_SPEC_VERSIONS)
        or os.environ.get(SKIP_VERSION_CHECK_ENV) == "1"
    ):
        return ""
    return (
        f"it implements spec {', '.join(versions) or 'none'} and this nvfp4-core implements "
        f"{', '.join(SUPPORTED_SPEC_VERSIONS)} (set {SKIP_VERSION_CHECK_ENV}=1 to override)"
    )


def _missing_hardware_hint(installed: set[str]) -> str:
    """A cheap probe for hardware whose backend is not installed."""
    hints = []
    if "cuda" not in installed and driver_evidence("nvidia"):
        hints.append("an NVIDIA GPU is present: `pip install nvfp4-cuda`")
    if "rocm" not in installed and driver_evidence("amd"):
        hints.append("an AMD GPU is present: `pip install nvfp4-rocm`")
    if "metal" not in installed and platform.system() == "Darwin" and platform.machine() == "arm64":
        hints.append("Apple silicon: `pip install nvfp4-metal`")
    return "; ".join(hints)


def get_backend(name: str | None = None) -> Frontend:
    """The backend called ``name`` (else ``$NVFP4_BACKEND``), or the best available one."""
    entries = discover()
    installed = sorted(entries)
    requested = name or os.environ.get("NVFP4_BACKEND") or None
    if requested is not None:
        entry = entries.get(requested)
        if entry is None:
            raise BackendUnavailable(requested, "it is not installed", installed)
        avail = entry.availability()
        if not avail.ok:
            raise BackendUnavailable(requested, avail.reason, installed)
        b = entry.load()
        assert b is not None  # available, so loaded
        mismatch = _spec_ok(b)
        if mismatch:
            raise BackendUnavailable(requested, mismatch, installed)
        return b

    # Loading an entry imports its module only; asking availability() may import a whole
    # framework (an engine adapter's torch, compressed-tensors, ...). So every entry is
    # loaded (its load errors reported), then availability is asked in priority order
    # (installation order among equals) and the first available backend wins: a backend
    # below the best available one is never probed. The reference (priority 0) is always
    # available, so nothing below it is ever asked.
    loaded: list[tuple[BackendEntry, Frontend]] = []
    for entry in entries.values():
        b = entry.load()
        if b is not None:
            loaded.append((entry, b))
        elif entry.error:
            warnings.warn(f"NVFP4 backend {entry.name!r} skipped: {entry.error}", stacklevel=2)
    loaded.sort(key=lambda pair: -pair[1].info.priority)  # stable: installation order kept
    best = next(b for entry, b in loaded if entry.availability().ok and not _spec_ok(b))
    if best.info.name == "reference":
        hint = _missing_hardware_hint(set(entries))
        if hint:
            warnings.warn(f"using the numpy reference backend; {hint}", stacklevel=2)
    return best
