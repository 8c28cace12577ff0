"""Where core finds the spec's data files (``spec/<folder>/<name>``), and the TOML parser
that reads them.

The files live once, under ``spec/`` at the root of the repository. An installed wheel
carries them as package data, ``nvfp4/spec_data/<folder>/<name>``
(``packages/nvfp4-core/hatch_build.py`` copies them when the wheel or the sdist is built);
a source checkout (``PYTHONPATH=src``, or an editable install, which maps the package to
``src/``) has no ``spec_data/`` and reads the repository's ``spec/`` folder,
``../../../../spec`` from this package's folder. :mod:`nvfp4.tolerances` (a released
version's ``tolerances.toml``) and :mod:`nvfp4.deviation_registry` (1.2's
``deviations.toml``) find their files here.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli is the same parser (a dependency there)
    import tomli as tomllib

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["SPEC_DATA", "spec_file", "tomllib"]

#: The package data folder of an installed wheel: ``<folder>/<name>`` under it.
SPEC_DATA: Final = "spec_data"
#: The repository's ``spec/`` folder, seen from this package's folder in a source checkout
#: (``packages/nvfp4-core/src/nvfp4``; ``.parent`` stops at the root, so an installed
#: package anywhere gets a path that simply does not exist).
CHECKOUT_SPEC: Path = Path(__file__).resolve().parent.parent.parent.parent.parent / "spec"


def spec_file(folder: str, name: str, what: str) -> Traversable:
    """``spec/<folder>/<name>`` (``folder`` a released version or ``draft``): the package
    data of an installed wheel (``nvfp4/spec_data/<folder>/<name>``), else the source
    checkout's ``spec/<folder>/<name>``.

    Raises:
        FileNotFoundError: when neither exists (a broken installation); the message starts
            with ``what`` and names both places.
    """
    packaged = resources.files(__package__ or "nvfp4").joinpath(SPEC_DATA, folder, name)
    if packaged.is_file():
        return packaged
    checkout = CHECKOUT_SPEC / folder / name
    if checkout.is_file():
        return checkout
    raise FileNotFoundError(
        f"{what}: neither the package data {packaged} nor the source "
        f"checkout's {checkout} exists; reinstall nvfp4-core from a wheel or an sdist"
    )
