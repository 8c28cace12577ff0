"""The prepared GPU check (benchmarks/gpu/prepare.sh, then one device call of run.sh) has all
it imports on the lent machine: every requirement of the wheels it builds is in the machine's
image (benchmarks/gpu/device-image.txt) or carried (benchmarks/gpu/carried.txt), and so is
every requirement of what is carried. A session has 15 minutes of device time for one run,
so a missing package must fail here, not there."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
#: The packages prepare.sh builds into wheels (what run.sh installs on the machine).
BUILT = ("packages/nvfp4-core", "packages/nvfp4-triton", "packages/nvfp4-cuda", "conformance")


def _lines(name: str) -> list[str]:
    text = (GPU / name).read_text(encoding="utf-8")
    return [s for s in (line.strip() for line in text.splitlines()) if s and s[0] != "#"]


def _image() -> tuple[set[str], str]:
    """The image's package names and its Python version (the ``python X.Y`` line)."""
    names, python = set(), ""
    for line in _lines("device-image.txt"):
        if line.startswith("python "):
            python = line.split()[1]
        else:
            names.add(canonicalize_name(line))
    assert python, "device-image.txt: no 'python X.Y' line"
    return names, python


def _needed(requirements: list[str], python: str) -> set[str]:
    """The names ``requirements`` need on ``python`` (markers evaluated, extras left out)."""
    env = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    out = set()
    for text in requirements:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            out.add(canonicalize_name(req.name))
    return out


def _missing(python: str, image: set[str], carried: set[str]) -> dict[str, set[str]]:
    built = {}
    for folder in BUILT:
        project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text("utf-8"))["project"]
        built[canonicalize_name(project["name"])] = project.get("dependencies", [])
    have = image | carried | set(built)
    missing = {}
    for name, requirements in built.items():
        lacking = _needed(requirements, python) - have
        if lacking:
            missing[name] = lacking
    for name in carried:  # what is carried needs its own requirements there too
        lacking = _needed(metadata.requires(name) or [], python) - have
        if lacking:
            missing[name] = lacking
    return missing


def test_every_requirement_is_in_the_image_or_carried() -> None:
    image, python = _image()
    carried = {canonicalize_name(Requirement(r).name) for r in _lines("carried.txt")}
    assert _missing(python, image, carried) == {}


def test_the_check_can_fail() -> None:
    """Without the carried packages, the suite's jsonschema (and its own needs) is missing."""
    image, python = _image()
    missing = _missing(python, image, set())
    assert missing == {"nvfp4-conformance": {"jsonschema"}}


def test_prepare_downloads_what_carried_txt_names() -> None:
    script = (GPU / "prepare.sh").read_text(encoding="utf-8")
    assert "$(grep -v '^#' benchmarks/gpu/carried.txt)" in script
    assert "--only-binary=:all:" in script
    assert '--python-version "$py"' in script
