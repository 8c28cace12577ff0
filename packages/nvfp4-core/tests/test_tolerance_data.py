"""``nvfp4.tolerances`` reads ``spec/<X.Y>/tolerances.toml``: what it returns, where it
reads from, and that the wheel and the sdist carry the files.

:data:`RELEASED_NUMBERS` is what every lookup returned for the released versions when the
numbers were a Python dict (before they were read from the TOML files). A released version
is immutable (``spec/README.md``), so these numbers can never change: the snapshot fails when
a lookup, a released TOML file or the reading of it drifts. It is a check of the released
numbers, not a source of them: a new version adds its own entry here when it is released.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from types import MappingProxyType
from typing import Any

import nvfp4
import pytest
from nvfp4 import deviation_registry, spec, spec_files, tolerances
from nvfp4.testing import module_from_file

PACKAGE_DIR = Path(tolerances.__file__).resolve().parent
CORE = Path(__file__).resolve().parents[1]

_MATMUL_10 = {
    "qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "gather_qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "w4a4": {"float32": 3e-7, "float16": 1e-3, "bfloat16": 1e-2},
}
_ENCODER = {"reference": 0.0, "others": 1e-5, "boundary_window": 2.0**-20}
_EXACT = {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0}

#: Every released version's numbers, as the Python tables held them.
RELEASED_NUMBERS: dict[str, dict[str, dict[str, float]]] = {
    "1.0": {"dequantize": _EXACT, "quantize": _ENCODER, **_MATMUL_10, "w4a8": {}},
    "1.1": {
        "dequantize": _EXACT,
        "quantize": _ENCODER,
        **_MATMUL_10,
        "quantize_q8": _ENCODER,
        "w4a8": {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2},
        "w4a8_fp8": {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2},
    },
}
#: 1.2 (read from its TOML since it was released): 1.1's numbers, and sharding's.
RELEASED_NUMBERS["1.2"] = {
    **RELEASED_NUMBERS["1.1"],
    "row_parallel": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
}
#: 1.3: 1.2's numbers; its accumulation floor is no table of numbers (RELEASED_FLOORS).
RELEASED_NUMBERS["1.3"] = RELEASED_NUMBERS["1.2"]
#: 1.4: 1.3's numbers; its floor also covers row-parallel sums (RELEASED_FLOORS).
RELEASED_NUMBERS["1.4"] = RELEASED_NUMBERS["1.3"]
#: 1.5: 1.4's numbers and floor (it adds a deviation to the registry, no number).
RELEASED_NUMBERS["1.5"] = RELEASED_NUMBERS["1.4"]
#: The accumulation floor of each version: none before 1.3.
RELEASED_FLOORS: dict[str, tolerances.AccumulationFloor | None] = {
    "1.0": None,
    "1.1": None,
    "1.2": None,
    "1.3": tolerances.AccumulationFloor(
        factor=2.5, paths=("qmm", "gather_qmm", "w4a4", "w4a8", "w4a8_fp8")
    ),
    "1.4": tolerances.AccumulationFloor(
        factor=2.5, paths=("qmm", "gather_qmm", "w4a4", "w4a8", "w4a8_fp8", "row_parallel")
    ),
}
RELEASED_FLOORS["1.5"] = RELEASED_FLOORS["1.4"]


def _plain(table: Any) -> dict[str, dict[str, float]]:
    return {path: dict(numbers) for path, numbers in table.items()}


@pytest.mark.parametrize("version", sorted(RELEASED_NUMBERS, key=spec.version_key))
def test_released_numbers_are_unchanged(version: str) -> None:
    table = tolerances.tolerances_for(version)
    assert _plain(table) == RELEASED_NUMBERS[version]
    assert isinstance(table, MappingProxyType)
    for path, numbers in table.items():
        assert isinstance(numbers, MappingProxyType), path
        for key, number in numbers.items():
            assert type(number) is float, f"[{path}] {key} = {number!r}"
            assert tolerances.tolerance(path, key, spec=version) == number
    assert tolerances.accumulation_floor(version) == RELEASED_FLOORS[version]


def test_module_names_are_unchanged() -> None:
    assert set(RELEASED_NUMBERS) == set(spec.SUPPORTED_SPEC_VERSIONS)
    newest = max(RELEASED_NUMBERS, key=spec.version_key)
    assert tolerances.TOLERANCES_SPEC_VERSION == newest == spec.SPEC_VERSION
    assert _plain(tolerances.TOLERANCES) == RELEASED_NUMBERS[newest]
    assert _plain(tolerances.tolerances_for()) == RELEASED_NUMBERS[newest]
    assert tolerances.tolerance("qmm", "float16") == 1e-3
    assert tolerances.METRIC == "max|y - ref| / max|ref|"
    assert set(tolerances.__all__) >= {
        "METRIC",
        "TOLERANCES",
        "TOLERANCES_SPEC_VERSION",
        "accumulation_floor",
        "tolerance",
        "tolerances_for",
    }
    assert tolerances.accumulation_floor() == RELEASED_FLOORS[newest]


# ------------------------------------------------------------- where the files are read
def _checkout_spec() -> Path | None:
    """The repository's ``spec/`` when these tests run from a checkout."""
    root = CORE.parent.parent
    return root / "spec" if (root / "spec" / "README.md").is_file() else None


def test_every_version_reads_the_package_data_or_the_checkouts_spec() -> None:
    packaged = PACKAGE_DIR / tolerances.SPEC_DATA
    for version in spec.SUPPORTED_SPEC_VERSIONS:
        source = Path(str(tolerances.data_file(version)))
        if packaged.is_dir():  # an installed wheel
            assert source == packaged / version / "tolerances.toml"
        else:  # a source checkout or an editable install
            assert source == CORE.parent.parent / "spec" / version / "tolerances.toml"
        checkout = _checkout_spec()
        if checkout is not None:
            assert source.read_bytes() == (checkout / version / "tolerances.toml").read_bytes()


def test_a_checkout_holds_no_copy_of_the_spec_data() -> None:
    """In a checkout ``spec/`` is read; a ``src/nvfp4/spec_data/`` would shadow it."""
    if _checkout_spec() is None or PACKAGE_DIR != CORE / "src" / "nvfp4":
        pytest.skip("not a source checkout: the package data is the installed wheel's")
    assert not (PACKAGE_DIR / tolerances.SPEC_DATA).exists(), (
        f"remove {PACKAGE_DIR / tolerances.SPEC_DATA}: the build writes it into the wheel only"
    )


def test_package_data_wins_and_is_what_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = spec.SPEC_VERSION
    original = tolerances.data_file(version).read_text(encoding="utf-8")
    data = tmp_path / tolerances.SPEC_DATA / version
    data.mkdir(parents=True)
    (data / "tolerances.toml").write_text(
        original.replace("float32 = 1e-4", "float32 = 5e-5", 1), encoding="utf-8"
    )
    monkeypatch.setattr(spec_files.resources, "files", lambda _package: tmp_path)
    assert Path(str(tolerances.data_file(version))) == data / "tolerances.toml"
    _, table, _ = tolerances._read(version)
    assert table["qmm"]["float32"] == 5e-5 != tolerances.TOLERANCES["qmm"]["float32"]


def test_no_file_and_a_wrong_version_fail_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec_files.resources, "files", lambda _package: tmp_path)
    monkeypatch.setattr(spec_files, "CHECKOUT_SPEC", tmp_path / "spec")
    with pytest.raises(
        FileNotFoundError, match=r"^spec 1\.1 tolerances: .*spec_data.1\.1.*spec.1\.1"
    ):
        tolerances.data_file("1.1")
    # the registries are looked up the same way, naming what they looked for
    with pytest.raises(FileNotFoundError, match=r"^deviation registry: .*spec.1\.2.deviations"):
        deviation_registry.data_file("1.4")
    with pytest.raises(FileNotFoundError, match=r"^deviation registry: .*spec.1\.5.deviations"):
        deviation_registry.data_file()
    wrong = tmp_path / tolerances.SPEC_DATA / "1.1"
    wrong.mkdir(parents=True)
    (wrong / "tolerances.toml").write_text('spec_version = "1.0"\nmetric = "m"\n')
    with pytest.raises(ValueError, match=r"states spec_version '1\.0', expected '1\.1'"):
        tolerances._read("1.1")


# ---------------------------------------------------------------- what the build carries
@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``packages/nvfp4-core/hatch_build.py`` (with a stand-in for hatchling's base class,
    for this test only, where hatchling is not installed: the mapping does not use it)."""
    if importlib.util.find_spec("hatchling") is None:
        package = "hatchling.builders.hooks.plugin"
        for name in ("hatchling", "hatchling.builders", "hatchling.builders.hooks", package):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        interface = types.ModuleType(f"{package}.interface")
        interface.BuildHookInterface = object  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, interface.__name__, interface)
    path = CORE / "hatch_build.py"
    if not path.is_file():
        pytest.skip("hatch_build.py is not installed: run from a checkout or an sdist")
    return module_from_file(path, "nvfp4_core_hatch_build")


def test_the_build_packages_every_released_version(hook: types.ModuleType) -> None:
    if _checkout_spec() is None:
        pytest.skip("not a checkout: no spec/ to package")
    assert hook.SPEC_DATA == tolerances.SPEC_DATA
    spec_dir = CORE.parent.parent / "spec"
    for target, prefix in (("wheel", "nvfp4"), ("sdist", "src/nvfp4")):
        mapping = hook.spec_data_map(CORE, target)
        assert mapping == {
            str(spec_dir / v / "tolerances.toml"): f"{prefix}/spec_data/{v}/tolerances.toml"
            for v in spec.SUPPORTED_SPEC_VERSIONS
        } | {
            str(spec_dir / v / "deviations.toml"): f"{prefix}/spec_data/{v}/deviations.toml"
            for v in spec.SUPPORTED_SPEC_VERSIONS
            if (spec_dir / v / "deviations.toml").is_file()  # the registry: 1.2's (1.3 keeps it)
        } | {
            str(spec_dir / "draft" / name): f"{prefix}/spec_data/draft/{name}"
            for name in hook.DRAFT_FILES
        }, target
        assert str(spec_dir / "1.2" / "deviations.toml") in mapping
        assert hook.DRAFT_FILES == ()  # the draft holds its README only


def test_a_wheel_from_an_sdist_takes_the_files_it_carries(
    hook: types.ModuleType, tmp_path: Path
) -> None:
    sdist = tmp_path / "nvfp4_core-0.0.0"
    with pytest.raises(FileNotFoundError, match="no spec tolerance files"):
        hook.spec_data_map(sdist, "wheel")
    (sdist / "src" / "nvfp4" / tolerances.SPEC_DATA / "1.0").mkdir(parents=True)
    assert hook.spec_data_map(sdist, "wheel") == {}


def test_the_hook_is_configured_for_the_wheel_and_the_sdist() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    pyproject = CORE / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("no pyproject.toml: not a checkout or an sdist")
    hatch = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["hatch"]["build"]
    assert "custom" in hatch["hooks"], "the build hook runs for every target"
    assert "hatch_build.py" in hatch["targets"]["sdist"]["include"]
    assert nvfp4.__name__ == "nvfp4"
