"""The tolerances of every released NVFP4 spec version, read from the spec's own files.

The numbers live in one place, ``spec/<version>/tolerances.toml`` (the normative files, with
the measurements behind every number); this module reads them, it restates none. Where the
file of a version is found (:func:`data_file`):

* an installed wheel carries every released version's file as package data,
  ``nvfp4/spec_data/<version>/tolerances.toml`` (``packages/nvfp4-core/hatch_build.py``
  copies them from ``spec/`` when the wheel or the sdist is built);
* a source checkout (``PYTHONPATH=src``, or an editable install, which maps the package to
  ``src/``) has no ``spec_data/``: the module reads the repository's ``spec/`` folder,
  ``../../../../spec`` from this package's folder.

Which versions are released is :data:`nvfp4.spec.SUPPORTED_SPEC_VERSIONS` (the versions
with a table in :mod:`nvfp4.spec`); ``tests/test_spec_drift.py`` keeps it equal to the
released folders under ``spec/``.

Matmul paths (``qmm``, ``gather_qmm``, ``w4a4``) give, per output dtype, the largest
allowed ``max|y - ref| / max|ref|`` against the float64 reference computed from the same x
(:mod:`nvfp4.reference`). ``dequantize`` is exact (0). ``quantize`` holds ``reference``
(0 disagreements), ``others`` (the largest fraction of elements another encoder may change,
each at a rounding boundary) and ``boundary_window`` (how close to a boundary, relative).
``w4a8`` is reserved in spec 1.0: it has no number. Spec 1.1 gives ``w4a8`` (int8
activations) and ``w4a8_fp8`` numbers per output dtype, and ``quantize_q8`` (``reference``,
``others``, ``boundary_window``) for int8 activation encoders.

Spec 1.2 adds ``row_parallel`` (section "Sharding"): per output dtype, the bound of a
row-parallel (K-sharded) matmul's float32-reduced sum. Spec 1.3 adds
``[accumulation_floor]``, which is not a table of numbers per dtype: the factor of the bound
an output element of a matmul path also conforms within where its sum cancels, and the paths
it applies to (:func:`accumulation_floor`; :mod:`nvfp4.accumulation_floor` computes the
bound). Spec 1.4 names ``row_parallel`` among those paths (:data:`SUM_TABLES`): a
row-parallel sum conforms within the floor of the unsharded call. Every file's values are checked where they are read (:func:`parse_tables`,
:func:`parse_floor`). A draft's file (``spec/draft/``, while one is
edited) is no released version: nothing here reads it.

A lookup names the version it certifies (``tolerance("qmm", "float16", spec="1.0")``): a
1.0 certificate made after 1.1 ships must use 1.0's numbers. Without ``spec`` it gets the
newest version's. :data:`TOLERANCES` is the newest version's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from ._moved import renamed
from .contract import VERBS
from .dtypes import dtype_name
from .spec import SPEC_VERSION, SUPPORTED_SPEC_VERSIONS, released, version_key
from .spec_files import SPEC_DATA as SPEC_DATA  # the package data folder: <version>/ under it
from .spec_files import spec_file, tomllib

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = [
    "FLOOR_TABLE",
    "METRIC",
    "SUM_TABLES",
    "TOLERANCES",
    "TOLERANCES_SPEC_VERSION",
    "AccumulationFloor",
    "accumulation_floor",
    "data_file",
    "parse_floor",
    "parse_tables",
    "tolerance",
    "tolerances_for",
]

Table = Mapping[str, Mapping[str, float]]

#: The table of a ``tolerances.toml`` (from spec 1.3) that holds the accumulation floor.
FLOOR_TABLE: Final = "accumulation_floor"
#: Tables of a ``tolerances.toml`` that bound a matmul's sum but belong to no verb: the
#: float32-reduced sum of a row-parallel matmul (``[row_parallel]``, from spec 1.2). The
#: floor's ``paths`` may name them (spec 1.4) besides the matmul verbs' tables.
SUM_TABLES: Final = ("row_parallel",)
#: Keys of a file that are not tables of numbers.
_NOT_NUMBERS: Final = ("spec_version", "metric", FLOOR_TABLE)


@dataclass(frozen=True)
class AccumulationFloor:
    """Spec 1.3's floor of the matmul bound (``nvfp4.md``, "Tolerances"): an output element
    ``(m, n)`` of a path in :attr:`paths` also conforms when ``|y - ref| <= factor *
    sqrt(K) * 2^-24 * S[m, n] + spacing(|ref[m, n]|)`` (:mod:`nvfp4.accumulation_floor`)."""

    factor: float
    paths: tuple[str, ...]


def data_file(version: str) -> Traversable:
    """The ``tolerances.toml`` of released spec ``version``: the package data of an
    installed wheel (``nvfp4/spec_data/<version>/``), else the source checkout's
    ``spec/<version>/``.

    Raises:
        FileNotFoundError: when neither exists (a broken installation); the message names
            both places.
    """
    return spec_file(version, "tolerances.toml", f"spec {version} tolerances")


def parse_tables(text: str, source: str) -> Table:
    """The tables of a ``tolerances.toml`` text (:func:`_tables`); an error names ``source``
    in one line."""
    return _tables(_toml(text, source), source)


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not TOML: {exc}") from None


def _tables(data: Mapping[str, Any], source: str) -> Table:
    """The tables of a parsed ``tolerances.toml``: every table's every value checked to be a
    finite number >= 0; an error names ``source``, the table, the key and what it found, in
    one line. ``spec_version``, ``metric`` and ``[accumulation_floor]`` (:func:`parse_floor`)
    are not tables of numbers."""
    tables: dict[str, Mapping[str, float]] = {}
    for path, numbers in data.items():
        if path in _NOT_NUMBERS:
            continue
        if not isinstance(numbers, dict):
            raise ValueError(f"{source}: [{path}]: expected a table, found {numbers!r}")
        for key, n in numbers.items():
            ok = isinstance(n, (int, float)) and not isinstance(n, bool)
            if not ok or not 0.0 <= float(n) < float("inf"):
                raise ValueError(
                    f"{source}: [{path}] {key}: expected a finite number >= 0, found {n!r}"
                )
        tables[path] = MappingProxyType({k: float(n) for k, n in numbers.items()})
    return MappingProxyType(tables)


def parse_floor(data: Mapping[str, Any], tables: Table, source: str) -> AccumulationFloor | None:
    """The ``[accumulation_floor]`` of a parsed ``tolerances.toml`` (``None`` where the file
    has none: before spec 1.3), checked: exactly the keys ``factor`` (a finite number > 0)
    and ``paths`` (a non-empty list of distinct names of the file's tables of matmul verbs,
    or of :data:`SUM_TABLES`). An error names ``source``, the key and what it found, in
    one line."""
    if FLOOR_TABLE not in data:
        return None
    floor = data[FLOOR_TABLE]
    where = f"{source}: [{FLOOR_TABLE}]"
    if not isinstance(floor, dict):
        raise ValueError(f"{where}: expected a table, found {floor!r}")
    if set(floor) != {"factor", "paths"}:
        raise ValueError(f"{where}: expected the keys factor and paths, found {sorted(floor)}")
    factor, paths = floor["factor"], floor["paths"]
    number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
    if not number or not 0.0 < float(factor) < float("inf"):
        raise ValueError(f"{where} factor: expected a finite number > 0, found {factor!r}")
    # the paths of the matmul verbs (a verb's capability names its tolerance table) and the
    # sums of sharded matmuls
    verbs = {v.capability for v in VERBS.values() if v.kind == "matmul"}
    matmul = sorted((verbs | set(SUM_TABLES)) & set(tables))
    if (
        not isinstance(paths, list)
        or not paths
        or len(set(map(str, paths))) != len(paths)
        or not all(isinstance(p, str) and p in matmul for p in paths)
    ):
        raise ValueError(
            f"{where} paths: expected a non-empty list of distinct paths among "
            f"{', '.join(matmul)}, found {paths!r}"
        )
    return AccumulationFloor(factor=float(factor), paths=tuple(paths))


def _read(version: str) -> tuple[str, Table, AccumulationFloor | None]:
    """The metric, the numbers and the floor of ``version``'s file (read and parsed once),
    read-only; its ``spec_version`` must be ``version``."""
    source = data_file(version)
    data = _toml(source.read_text(encoding="utf-8"), str(source))
    stated = data.get("spec_version")
    if stated != version:
        raise ValueError(f"{source} states spec_version {stated!r}, expected {version!r}")
    tables = _tables(data, str(source))
    return str(data["metric"]), tables, parse_floor(data, tables, str(source))


_READ: Final = {v: _read(v) for v in SUPPORTED_SPEC_VERSIONS}

#: Every released version's numbers, by version (read once, at import).
_BY_VERSION: dict[str, Table] = {v: table for v, (_, table, _) in _READ.items()}
#: Every released version's floor (``None`` before 1.3), by version.
_FLOORS: dict[str, AccumulationFloor | None] = {v: f for v, (_, _, f) in _READ.items()}

#: The matmul error measure the numbers bound (:func:`nvfp4.testing.relative_error`): the
#: newest file's ``metric``.
METRIC: Final = _READ[SPEC_VERSION][0]


def _newest() -> str:
    return max(_BY_VERSION, key=version_key)


def tolerances_for(version: str | None = None) -> Table:
    """The numbers of spec ``version`` (default: the newest this package has), read-only:
    path -> (key -> number). Keys are output dtype names (``"float32"``, ``"float16"``,
    ``"bfloat16"``), except for ``quantize`` (``"reference"``, ``"others"``,
    ``"boundary_window"``); a reserved path has an empty table.

    Raises:
        SpecVersionError: for a version without numbers here; the one-line message names
            the versions that have them.
    """
    return released(_BY_VERSION, _newest() if version is None else version, "tolerances")


def accumulation_floor(version: str | None = None) -> AccumulationFloor | None:
    """The accumulation floor of spec ``version`` (default: the newest this package has),
    ``None`` for a version without one (1.0-1.2: every call is held to
    ``max|y - ref| / max|ref|`` alone).

    Raises:
        SpecVersionError: for a version without numbers here.
    """
    v = _newest() if version is None else version
    released(_BY_VERSION, v, "tolerances")
    return _FLOORS.get(v)


def tolerance(path: str, dtype: Any, spec: str | None = None) -> float:
    """The number of spec ``spec`` (default: the newest) for ``path`` and ``dtype``.

    Args:
        path: ``"qmm"``, ``"gather_qmm"``, ``"w4a4"``, ``"dequantize"`` or ``"quantize"``.
        dtype: an output dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``) or a
            numpy / ml_dtypes dtype; for ``quantize`` one of ``"reference"``, ``"others"``,
            ``"boundary_window"``.
        spec: the spec version being certified (``"1.0"``).

    Raises:
        SpecVersionError: for an unknown spec version.
        KeyError: for an unknown path, a reserved path (``w4a8``) or a key the path lacks;
            the message names what was asked and what exists.
    """
    tables = tolerances_for(spec)
    v = _newest() if spec is None else spec
    if path not in tables:
        raise KeyError(
            f"spec {v} tolerances: unknown path {path!r}; "
            f"expected one of {', '.join(sorted(tables))}"
        )
    table = tables[path]
    if not table:
        raise KeyError(
            f"spec {v} tolerances: path {path!r} is reserved and has no "
            "numbers in this spec version (a backend cannot be certified for it)"
        )
    key = dtype_name(dtype)
    if key not in table:
        raise KeyError(
            f"spec {v} tolerances: path {path!r} has no entry {key!r}; "
            f"expected one of {', '.join(sorted(table))}"
        )
    return float(table[key])


#: The spec version of :data:`TOLERANCES` (the newest, :data:`nvfp4.spec.SPEC_VERSION`).
TOLERANCES_SPEC_VERSION: Final = SPEC_VERSION
#: The newest version's numbers (``tolerances_for(TOLERANCES_SPEC_VERSION)``), read-only.
TOLERANCES: Final[Table] = tolerances_for(TOLERANCES_SPEC_VERSION)


#: Spec 1.2 released the draft's numbers (``[row_parallel]``, the sharding table): the
#: draft's readers of 1.2's days, kept one release.
__getattr__ = renamed(
    __name__,
    {
        "parse_draft": ("parse_tables", parse_tables),
        "draft_tolerances": ("tolerances_for", lambda: tolerances_for("1.2")),
    },
)
