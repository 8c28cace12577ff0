"""The backends the tree publishes, said once: the pyproject files' ``nvfp4.backends``
entry points. The noxfile derives its sessions from them, and core's registry, which must
work from installed wheels without the tree, names the distribution of each; this test keeps
the registry's table equal to the tree's."""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from nvfp4.registry import ENTRY_POINT_GROUP, KNOWN_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402


def _published() -> dict[str, str]:
    found = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        if pyproject.parent == noxfile.ENGINES:  # third-party engine adapters: not ours
            continue
        for name in project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}):
            found[name] = project["name"]
    return found


def test_registry_names_the_packages_the_tree_publishes() -> None:
    published = _published()
    assert {"reference", "cpu", "cuda", "rocm", "metal"} <= set(published)
    assert published == KNOWN_PACKAGES


def test_nox_sessions_cover_every_published_backend() -> None:
    published = _published()
    assert sorted(noxfile.HARDWARE) == sorted(published)
    for name, path in noxfile.HARDWARE.items():
        if path is None:
            assert published[name] == "nvfp4-core"
        else:
            assert (
                tomllib.loads((path / "pyproject.toml").read_text())["project"]["name"]
                == published[name]
            )
