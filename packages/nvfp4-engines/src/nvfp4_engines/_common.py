"""What every engine adapter shares: the installed engine's version (read from its
distribution's metadata, so nothing heavy is imported), the ``BackendInfo`` of an adapter
with the engine named in a note the engines matrix reads back, and numpy array conversion
for the engines whose arrays are numpy's.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.contract import BackendInfo
from nvfp4.spec import SUPPORTED_SPEC_VERSIONS

from ._version import __version__

__all__ = [
    "ENGINE_NOTE",
    "PRIORITY",
    "adapter_info",
    "dist_version",
    "engine_note",
    "numpy_in",
    "numpy_out",
]

#: Below the reference backend's 0: an engine adapter is certified by name, never chosen by
#: ``nvfp4.get_backend()`` on its own.
PRIORITY: Final = -100

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
        spec_versions=SUPPORTED_SPEC_VERSIONS,
        priority=PRIORITY,
        capabilities=capabilities,
        version=__version__,
        package="nvfp4-engines",
        notes=(engine_note(distribution), *notes),
    )


def numpy_in(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A numpy engine's native array: the array itself."""
    return np.asarray(a)


def numpy_out(a: Any) -> npt.NDArray[Any]:
    """Back to numpy (dtype preserved)."""
    return np.asarray(a)
