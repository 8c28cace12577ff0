"""Deprecated aliases, kept one release, each with a ``DeprecationWarning`` naming what
replaces it: modules that moved to another distribution (:func:`moved`) and names that were
renamed (:func:`renamed`).

An alias module holds one line, ``__getattr__ = moved(__name__, "new.module", "dist")``. The
new module is imported by name at run time, so nvfp4-core carries no import of it (core
imports neither torch nor any package above it); without that distribution installed the
import fails naming it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["moved", "renamed"]


def moved(old: str, new: str, distribution: str) -> Callable[[str], Any]:
    """Import ``new`` for the alias module ``old`` (warning once) and return the module
    ``__getattr__`` that forwards every name to it."""
    warnings.warn(
        f"{old} moved to {new} (pip install {distribution}); the alias {old} is removed in "
        "the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    try:
        target = importlib.import_module(new)
    except ImportError as exc:
        raise ImportError(
            f"{old} moved to {new}, in the {distribution} distribution: pip install "
            f"{distribution} ({exc})"
        ) from exc

    def forward(name: str) -> Any:
        return getattr(target, name)

    return forward


def renamed(module: str, aliases: dict[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``module`` that serves each old name in ``aliases``
    (old name -> (new name, object)) with a ``DeprecationWarning``, and raises
    ``AttributeError`` for any other missing name."""

    def forward(name: str) -> Any:
        if name not in aliases:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, obj = aliases[name]
        warnings.warn(
            f"{module}.{name} is renamed {module}.{new}; the alias {name} is removed in the "
            "next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return obj

    return forward
