"""Python files that are not installed modules (a maintainer script under ``tools/``, a
benchmark, a build hook), imported by a test from their path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["module_from_file"]


def module_from_file(path: Path | str, name: str) -> ModuleType:
    """The module of the Python file ``path``, run once under the module name ``name`` (not
    added to ``sys.modules``, so nothing else imports it by that name).

    Raises:
        ImportError: ``path`` cannot be loaded as a module (the message names it).
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be loaded as the Python module {name!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
