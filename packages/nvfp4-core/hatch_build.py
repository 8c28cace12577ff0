"""Build hook of nvfp4-core: the spec's tolerance files become package data.

``nvfp4.tolerances`` reads ``spec/<X.Y>/tolerances.toml``, the one copy of the numbers. An
installed package has no repository beside it, so the build carries every released
version's file (every ``spec/<X.Y>/`` folder holding ``nvfp4.md`` and ``tolerances.toml``):

* the wheel as ``nvfp4/spec_data/<X.Y>/tolerances.toml``;
* the sdist as ``src/nvfp4/spec_data/<X.Y>/tolerances.toml``, so that a wheel built from
  the sdist (no ``spec/`` there) finds them inside the package like any other file.

A released folder's other files the package reads (:data:`RELEASED_EXTRA_FILES`: from 1.2
the deviation registry read by ``nvfp4.deviation_registry``) go to
``nvfp4/spec_data/<X.Y>/<name>`` in the same way, and the draft's files named in
:data:`DRAFT_FILES` (``spec/draft/<name>``; none while the draft holds only its README) to
``nvfp4/spec_data/draft/<name>``.

An editable install gets nothing: it maps ``nvfp4`` to ``src/nvfp4``, and
``nvfp4.tolerances`` reads the checkout's ``spec/`` folder itself. A checkout must not hold
``src/nvfp4/spec_data/`` (a stale copy would shadow ``spec/``); the build refuses one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: Where the package data lives inside the package.
SPEC_DATA = "spec_data"
_VERSION_DIR = re.compile(r"\d+\.\d+")
#: Files of ``spec/draft/`` the package reads (one line each, so helpers add theirs apart):
#: none while the draft holds only its README (1.2 released what it read).
DRAFT_FILES: tuple[str, ...] = ()
#: Files of a released folder the package reads besides ``tolerances.toml`` (every
#: version's), where the version has them.
RELEASED_EXTRA_FILES: tuple[str, ...] = (
    "deviations.toml",  # nvfp4.deviation_registry (from spec 1.2)
)


def released_tolerance_files(spec_dir: Path) -> dict[str, Path]:
    """Version -> ``tolerances.toml`` of every released folder under ``spec_dir``."""
    return {
        d.name: d / "tolerances.toml"
        for d in sorted(spec_dir.iterdir())
        if d.is_dir()
        and _VERSION_DIR.fullmatch(d.name)
        and (d / "nvfp4.md").is_file()
        and (d / "tolerances.toml").is_file()
    }


def released_extra_files(spec_dir: Path) -> dict[str, Path]:
    """``<version>/<name>`` -> the file, for every name of :data:`RELEASED_EXTRA_FILES` a
    released folder holds."""
    return {
        f"{version}/{name}": path.parent / name
        for version, path in released_tolerance_files(spec_dir).items()
        for name in RELEASED_EXTRA_FILES
        if (path.parent / name).is_file()
    }


def draft_data_files(spec_dir: Path) -> dict[str, Path]:
    """``draft/<name>`` -> the file, for every name of :data:`DRAFT_FILES` in ``spec/draft``."""
    draft = spec_dir / "draft"
    missing = [name for name in DRAFT_FILES if not (draft / name).is_file()]
    if missing:
        raise FileNotFoundError(f"no {draft / missing[0]}: the package reads it")
    return {f"draft/{name}": draft / name for name in DRAFT_FILES}


def spec_data_map(root: Path, target: str) -> dict[str, str]:
    """``force_include`` entries (source -> path in the artifact) for building ``target``
    (``"wheel"`` or ``"sdist"``) from the project folder ``root``: empty when ``root`` is an
    unpacked sdist, whose ``src/nvfp4/spec_data/`` the wheel takes as package files."""
    in_package = root / "src" / "nvfp4" / SPEC_DATA
    spec_dir = root.parent.parent / "spec"
    in_checkout = (spec_dir / "README.md").is_file() and root.parent.name == "packages"
    if not in_checkout:
        if not in_package.is_dir():
            raise FileNotFoundError(
                f"nvfp4-core: no spec tolerance files to package: neither {spec_dir} (a "
                f"checkout of the nvfp4 repository) nor {in_package} (an sdist) exists"
            )
        return {}
    if in_package.exists():
        raise FileExistsError(
            f"{in_package} exists in a checkout: it would shadow spec/; remove it (the build "
            "copies spec/<X.Y>/tolerances.toml into the wheel and the sdist)"
        )
    prefix = f"nvfp4/{SPEC_DATA}" if target == "wheel" else f"src/nvfp4/{SPEC_DATA}"
    files = released_tolerance_files(spec_dir)
    if not files:
        raise FileNotFoundError(f"no released spec folder under {spec_dir}")
    mapping = {str(path): f"{prefix}/{version}/tolerances.toml" for version, path in files.items()}
    mapping.update(
        {str(path): f"{prefix}/{name}" for name, path in released_extra_files(spec_dir).items()}
    )
    mapping.update(
        {str(path): f"{prefix}/{name}" for name, path in draft_data_files(spec_dir).items()}
    )
    return mapping


class SpecDataHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            return  # the editable package is src/nvfp4: it reads the checkout's spec/
        build_data["force_include"].update(spec_data_map(Path(self.root), self.target_name))
