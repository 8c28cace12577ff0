"""The spec's prose, its TOML and its code say the same thing, for every released version.

Each released spec version lives in three places: the prose (``spec/<X.Y>/nvfp4.md``), the
numbers (``spec/<X.Y>/tolerances.toml``) and the code (``nvfp4.spec.for_version("X.Y")``,
``nvfp4.tolerances.tolerances_for("X.Y")``). Every test here runs once per released folder
(every ``spec/<X.Y>/`` holding ``nvfp4.md`` and ``tolerances.toml``) and fails as soon as one
of them drifts:

* (0) every released folder has a table in code and every table in code has a folder;
* (a) ``tolerances_for(X.Y)`` equals ``tolerances.toml`` (the module reads the file: this
  checks the reading and the file's shape; ``test_tolerance_data.py`` pins the numbers);
* (b) every constant, table and formula of the prose equals ``for_version(X.Y)`` (the
  constants table, the E2M1 and E4M3 tables, the tie list, the swizzle formula evaluated
  against :func:`nvfp4.spec.swizzle_128x4_offset`, the worked example recomputed by the
  reference);
* (c) the version in the prose, the folder, the TOML and the changelog is ``X.Y``, and the
  newest folder is ``SPEC_VERSION``;
* (d) every section heading that code and documents cite exists.

The tests read the repository's ``spec/`` folder. They run from a checkout; from an
installed sdist (no ``spec/`` next to the package) they fail with a message saying so.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import nvfp4
import pytest
from nvfp4 import reference, spec, tolerances
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.spec import SpecTables, version_key

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (a test extra there)
    import tomli as tomllib

#: Section headings the drift test, the code (``spec 1.0, "..."``) and the other spec
#: documents rely on. Renaming one is a spec change: update this list with it.
REQUIRED_HEADINGS = (
    "Conventions",
    "Terminology",
    "Constants",
    "Canonical planes",
    "Fused partitions",
    "E2M1 (the element)",
    "E4M3 (the block scale)",
    "Decoding",
    "Matmul",
    "Tolerances",
    "MoE: gather_qmm",
    "The reference encoder",
    "Conformance of other encoders",
    "Layouts",
    "ModelOpt HF (canonical)",
    "compressed-tensors",
    "MLX native",
    "GGUF NVFP4",
    "128x4 scale swizzle",
    "Transcoding rules",
    "Activations",
    "W4A4",
    "W4A8",
    "Validation",
    "Conformance tiers",
    "Worked example",
)
#: Headings from a version on (the section 1.0 and 1.1 call "Sharding for tensor
#: parallelism" covers expert parallelism too from 1.2).
HEADINGS_FROM: dict[str, tuple[str, ...]] = {
    "1.0": ("Sharding for tensor parallelism",),
    "1.2": (
        "Sharding for tensor and expert parallelism",
        "Conformance classes and declared deviations",
    ),
}


def required_headings(version: str) -> tuple[str, ...]:
    """:data:`REQUIRED_HEADINGS` and the headings of the newest entry of
    :data:`HEADINGS_FROM` at or below ``version``."""
    start = max(
        (v for v in HEADINGS_FROM if version_key(v) <= version_key(version)), key=version_key
    )
    return REQUIRED_HEADINGS + HEADINGS_FROM[start]


#: The swizzle formula exactly as the prose states it.
SWIZZLE_FORMULA = "((n//128)*ceil(kb/4) + k//4)*512 + (n%32)*16 + ((n%128)//32)*4 + k%4"


def constants(t: SpecTables) -> dict[str, float]:
    """Row name of the prose's constants table -> the value in the version's table."""
    w4a8 = {}
    if t.q8_block_size is not None and t.q8_max is not None:  # from spec 1.1
        w4a8 = {"Q8 block size": t.q8_block_size, "Q8 max": t.q8_max}
    return w4a8 | {
        "block size": t.block_size,
        "E2M1 max": t.e2m1_max,
        "E4M3 max": t.e4m3_max,
        "E4M3 min subnormal": t.e4m3_min_subnormal,
        "E4M3 bias": t.e4m3_bias,
        "global amax divisor": t.global_amax_divisor,
        "GGUF type": t.gguf_type_nvfp4,
        "GGUF super-block": t.gguf_super_block,
        "GGUF super-block bytes": t.gguf_block_bytes,
        "swizzle row tile": t.swizzle_row_tile,
        "swizzle column tile": t.swizzle_col_tile,
    }


#: (section, phrase): facts the prose must state in words, where a number could drift.
PHRASES = (
    ("E4M3 (the block scale)", "(bias 7)"),
    ("E4M3 (the block scale)", "`0x00` .. `0x7E`"),
    ("E4M3 (the block scale)", "`0x7F`"),
    ("E4M3 (the block scale)", "bit 7 set"),
    ("E4M3 (the block scale)", "subnormal step is 2^-9"),
    ("The reference encoder", "`global = amax / 2688`"),
    ("The reference encoder", "`s = block_amax / (6 * global)`"),
    ("The reference encoder", "`[2^-9, 448]`"),
    ("The reference encoder", "`q = w / (e4m3(scale byte) * global)`"),
    ("The reference encoder", "`global = 1.0`"),
    ("The reference encoder", "sign bit is set when `w < 0`"),
    ("GGUF NVFP4", "type 40"),
    ("GGUF NVFP4", "super-blocks of 36 bytes"),
    ("GGUF NVFP4", "multiple of 64"),
    ("GGUF NVFP4", "`scale & 0x7F`"),
    ("GGUF NVFP4", "`<name>.scale`"),
    ("compressed-tensors", "`encode = float32(1 / float64(global))`"),
    ("compressed-tensors", '"format": "nvfp4-pack-quantized"'),
    ("MLX native", "`g * 2688`"),
    ("MLX native", "little-endian"),
    ("Canonical planes", "K MUST be a positive multiple of 16"),
    ("Activations", "`amax / 448`"),
    ("Tolerances", "`max|y - ref| / max|ref|`"),
)

#: Phrases a version states from that version on (W4A8, spec 1.1).
PHRASES_FROM = {
    "1.1": (
        ("W4A8", "`d = amax / 127`"),
        ("W4A8", "K MUST be a multiple of 32"),
        ("W4A8", "halfway cases **away from zero**"),
        ("W4A8", "`d` = NaN"),
        ("W4A8", "`xcode = e4m3(x / input_scale)`"),
        ("W4A8", "`amax / 448`"),
        ("Conformance of other encoders", "`[quantize_q8]`"),
    ),
}


# ------------------------------------------------------------------------- locating
def _repo_root() -> Path:
    """The checkout's root: the first parent of this file holding ``spec/README.md``."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "spec" / "README.md").is_file() and (parent / "packages").is_dir():
            return parent
    pytest.fail(
        f"spec/ not found above {here}: the drift tests compare the repository's spec/ folder "
        "with the package, so they must run from a checkout of the nvfp4 monorepo (an "
        "installed sdist does not carry spec/)",
        pytrace=False,
    )


_VERSION_DIR = re.compile(r"\d+\.\d+")


def released_folders(root: Path) -> list[str]:
    """Every released version under ``spec/``: a ``<X.Y>`` folder holding ``nvfp4.md`` and
    ``tolerances.toml``, oldest first."""
    found = [
        d.name
        for d in (root / "spec").iterdir()
        if d.is_dir()
        and _VERSION_DIR.fullmatch(d.name)
        and (d / "nvfp4.md").is_file()
        and (d / "tolerances.toml").is_file()
    ]
    return sorted(found, key=spec.version_key)


def _versions_to_check() -> list[str]:
    """The union of the released folders and the versions with a table in code (a folder
    without a table, or a table without a folder, then fails its own parameter)."""
    here = Path(__file__).resolve()
    roots = [p for p in here.parents if (p / "spec" / "README.md").is_file()]
    folders = released_folders(roots[0]) if roots else []
    return sorted(set(folders) | set(spec.SUPPORTED_SPEC_VERSIONS), key=spec.version_key)


@pytest.fixture(scope="module", params=_versions_to_check())
def version(request: pytest.FixtureRequest) -> str:
    v: str = request.param
    return v


@pytest.fixture(scope="module")
def spec_dir(version: str) -> Path:
    d = _repo_root() / "spec" / version
    for name in ("nvfp4.md", "tolerances.toml"):
        assert (d / name).is_file(), (
            f"nvfp4-core has a table for spec {version} but spec/{version}/{name} is missing"
        )
    return d


_Table = TypeVar("_Table")


def _released_table(version: str, lookup: Callable[[str], _Table], missing: str) -> _Table:
    """``lookup(version)``, failing the test with ``missing`` when nvfp4-core lacks the table
    of a released spec version."""
    try:
        return lookup(version)
    except spec.SpecVersionError as exc:
        pytest.fail(f"spec/{version}/ is released but {missing}: {exc}")


@pytest.fixture(scope="module")
def spec_tables(version: str) -> SpecTables:
    return _released_table(version, spec.for_version, "nvfp4.spec has no table")


@pytest.fixture(scope="module")
def tolerance_table(version: str) -> Any:
    return _released_table(version, tolerances.tolerances_for, "nvfp4.tolerances has no numbers")


@pytest.fixture(scope="module")
def prose(spec_dir: Path) -> str:
    return (spec_dir / "nvfp4.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def toml_data(spec_dir: Path) -> dict[str, Any]:
    with (spec_dir / "tolerances.toml").open("rb") as f:
        return tomllib.load(f)


# -------------------------------------------------------------------- markdown bits
_HEADING = re.compile(r"^(#{1,6}) +(.+?) *$")


def headings(md: str) -> list[tuple[int, str, int]]:
    """(level, title, line index) of every heading outside fenced code."""
    out = []
    fenced = False
    for i, line in enumerate(md.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = _HEADING.match(line)
        if m and not fenced:
            out.append((len(m.group(1)), m.group(2), i))
    return out


def section(md: str, title: str) -> str:
    """The text under heading ``title`` up to the next heading of the same or a higher level."""
    lines = md.splitlines()
    hs = headings(md)
    for idx, (level, t, line) in enumerate(hs):
        if t == title:
            end = next((ln for lv, _, ln in hs[idx + 1 :] if lv <= level), len(lines))
            return "\n".join(lines[line + 1 : end])
    raise AssertionError(f"nvfp4.md has no heading {title!r}")


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: rows (header row excluded) of stripped cells,
    backticks removed."""
    found: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            current = None
            continue
        cells = [c.strip().strip("`").strip() for c in s.strip("|").split("|")]
        if current is None:
            current = []
            found.append(current)
            continue  # header row
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue  # separator
        current.append(cells)
    return found


def parse_number(text: str) -> float:
    """``16``, ``448``, ``0.5``, ``-0.0``, ``2^-9``."""
    m = re.fullmatch(r"(-?\d+)\^(-?\d+)", text)
    if m:
        return float(int(m.group(1)) ** int(m.group(2)))
    return float(text)


# ------------------------------------------- (0) released folders == tables in code
def test_every_released_folder_has_its_tables_and_back() -> None:
    folders = released_folders(_repo_root())
    assert folders, "no released spec folder (spec/<X.Y>/ with nvfp4.md and tolerances.toml)"
    assert list(spec.SUPPORTED_SPEC_VERSIONS) == folders, (
        f"released folders {folders}, nvfp4.spec tables {list(spec.SUPPORTED_SPEC_VERSIONS)}"
    )
    in_code = sorted(tolerances._BY_VERSION, key=spec.version_key)
    assert in_code == folders, f"released folders {folders}, nvfp4.tolerances tables {in_code}"
    assert spec.SPEC_VERSION == folders[-1] == tolerances.TOLERANCES_SPEC_VERSION
    for v in folders:
        assert spec.for_version(v).version == v


def test_module_names_are_the_newest_table() -> None:
    newest = spec.for_version(spec.SPEC_VERSION)
    assert spec.E2M1_VALUES is newest.e2m1_values
    assert spec.E4M3_VALUES is newest.e4m3_values
    assert spec.E2M1_BOUNDS is newest.e2m1_bounds
    assert spec.E4M3_INVALID_BYTES is newest.e4m3_invalid_bytes
    assert newest.e4m3_nan_byte == spec.E4M3_NAN_BYTE == 0x7F
    assert newest.global_amax_divisor == spec.GLOBAL_AMAX_DIVISOR
    assert newest.reserved_paths == spec.RESERVED_PATHS
    assert tolerances.TOLERANCES is tolerances.tolerances_for(spec.SPEC_VERSION)
    assert not newest.e4m3_values.flags.writeable
    assert not newest.e2m1_values.flags.writeable
    with pytest.raises(AttributeError):
        newest.block_size = 32  # type: ignore[misc]


def test_unknown_version_is_one_line_naming_the_supported() -> None:
    for call in (
        lambda: spec.for_version("0.9"),
        lambda: tolerances.tolerances_for("0.9"),
        lambda: tolerances.tolerance("qmm", "float32", spec="0.9"),
    ):
        with pytest.raises(spec.SpecVersionError) as info:
            call()
        message = str(info.value)
        assert "'0.9'" in message
        assert "\n" not in message
        assert f"supported: {', '.join(spec.SUPPORTED_SPEC_VERSIONS)}" in message


# ----------------------------------------------------- (a) TOML == nvfp4.tolerances
def test_tolerances_module_equals_toml(
    version: str, toml_data: dict[str, Any], tolerance_table: Any
) -> None:
    data = dict(toml_data)
    assert data.pop("spec_version") == version
    assert data.pop("metric") == tolerances.METRIC
    floor = data.pop(tolerances.FLOOR_TABLE, None)
    read = tolerances.accumulation_floor(version)
    assert (None if read is None else {"factor": read.factor, "paths": list(read.paths)}) == floor
    mirrored = {path: dict(table) for path, table in tolerance_table.items()}
    assert data == mirrored, (
        f"nvfp4.tolerances.tolerances_for({version!r}) differs from "
        f"spec/{version}/tolerances.toml:\n  toml:   {data}\n  python: {mirrored}"
    )
    for path, table in data.items():
        for key, value in table.items():
            assert isinstance(value, float), (
                f"[{path}] {key} = {value!r} is not a float in the TOML"
            )
            assert math.isfinite(value), f"[{path}] {key} = {value!r}"
            assert value >= 0, f"[{path}] {key} = {value!r}"
            assert tolerances.tolerance(path, key, spec=version) == value


def test_toml_tables_cover_every_output_dtype(
    toml_data: dict[str, Any], spec_tables: SpecTables
) -> None:
    dtypes = set(OUTPUT_DTYPES)
    for path in ("dequantize", "qmm", "gather_qmm", "w4a4"):
        assert set(toml_data[path]) == dtypes, f"[{path}] keys {sorted(toml_data[path])}"
    if spec_tables.q8_block_size is not None:  # spec 1.1 on: W4A8 has numbers
        for path in ("w4a8", "w4a8_fp8"):
            assert set(toml_data[path]) == dtypes, f"[{path}] keys {sorted(toml_data[path])}"
        q8 = toml_data["quantize_q8"]
        assert q8["reference"] == 0.0, "the reference int8 activation encoder is bit-exact"
        assert 0.0 < q8["others"] <= 1e-4
        assert q8["boundary_window"] == 2.0**-20
    assert all(v == 0.0 for v in toml_data["dequantize"].values()), "decoding is exact"
    assert toml_data["quantize"]["reference"] == 0.0, "the reference encoder is bit-exact"
    assert toml_data["quantize"]["boundary_window"] == 2.0**-20
    reserved = {p for p, t in toml_data.items() if isinstance(t, dict) and not t}
    assert reserved == spec_tables.reserved_paths, (
        f"reserved (empty) tables {sorted(reserved)}, "
        f"for_version().reserved_paths {sorted(spec_tables.reserved_paths)}"
    )


def test_tolerance_lookup_and_errors() -> None:
    assert (
        tolerances.tolerance("qmm", np.dtype(np.float16)) == tolerances.TOLERANCES["qmm"]["float16"]
    )
    assert tolerances.tolerance("gather_qmm", OUTPUT_DTYPES["bfloat16"]) == 1e-2
    with pytest.raises(KeyError, match=r"unknown path 'qmv'.*gather_qmm"):
        tolerances.tolerance("qmv", "float32")
    with pytest.raises(KeyError, match=r"no entry 'float64'.*bfloat16"):
        tolerances.tolerance("qmm", "float64")
    with pytest.raises(KeyError, match="no entry"):
        tolerances.tolerance("qmm", np.dtype(np.int8))
    with pytest.raises(KeyError, match="'w4a8' is reserved"):
        tolerances.tolerance("w4a8", "float32", spec="1.0")
    with pytest.raises(TypeError):
        tolerances.TOLERANCES["qmm"]["float32"] = 1.0  # type: ignore[index]


# --------------------------------------------------------- (b) prose == nvfp4.spec
def test_constants_table(prose: str, spec_tables: SpecTables) -> None:
    rows = tables(section(prose, "Constants"))[0]
    stated = {r[0]: r[1] for r in rows}
    for name, value in constants(spec_tables).items():
        assert name in stated, f"constants table lacks {name!r}"
        assert parse_number(stated[name]) == value, f"{name}: prose {stated[name]}, spec.py {value}"
    bias = int(parse_number(stated["E4M3 bias"]))
    assert spec_tables.e4m3_values[bias << 3] == 1.0, "exponent field == bias must decode to 1.0"
    assert spec_tables.global_amax_divisor == spec_tables.e2m1_max * spec_tables.e4m3_max


def test_e2m1_table(prose: str, spec_tables: SpecTables) -> None:
    rows = tables(section(prose, "E2M1 (the element)"))[0]
    assert [int(r[0]) for r in rows] == list(range(16)), "the table lists codes 0..15 in order"
    for code, bits, value in rows:
        assert bits == format(int(code), "04b"), f"code {code}: bits {bits}"
        v = float(value)
        expected = spec_tables.e2m1_values[int(code)]
        assert v == expected, f"code {code}: prose {value}, spec.E2M1_VALUES {expected!r}"
        assert np.signbit(v) == np.signbit(expected), f"code {code}: sign of {value}"


def test_e4m3_table(prose: str, spec_tables: SpecTables) -> None:
    values = spec_tables.e4m3_values
    rows = tables(section(prose, "E4M3 (the block scale)"))[0]
    assert len(rows) >= 5
    for byte_text, e, m, value in rows:
        byte = int(byte_text, 16)
        assert int(e) == (byte >> 3) & 0xF, f"{byte_text}: exponent field {e}"
        assert int(m) == byte & 0x7, f"{byte_text}: mantissa field {m}"
        assert float(value) == values[byte], f"{byte_text}: prose {value}"
    assert values[0x7E] == spec_tables.e4m3_max
    assert values[0x01] == spec_tables.e4m3_min_subnormal
    nan_byte = spec_tables.e4m3_nan_byte
    assert f"`{nan_byte:#04X}`".replace("0X", "0x") in section(prose, "E4M3 (the block scale)")
    assert np.isnan(values[nan_byte])
    invalid = {b for b in range(256) if not np.isfinite(values[b]) or values[b] < 0}
    assert invalid | {0x80} <= spec_tables.e4m3_invalid_bytes  # 0x80 is -0: invalid by bit 7
    assert set(range(nan_byte)).isdisjoint(spec_tables.e4m3_invalid_bytes)


def test_tie_list(prose: str, spec_tables: SpecTables) -> None:
    rows = tables(section(prose, "The reference encoder"))[0]
    mags = [float(v) for v in spec_tables.e2m1_values[:8]]
    mids = [float(r[0]) for r in rows]
    assert mids == [float(b) for b in spec_tables.e2m1_bounds], f"tie list {mids}"
    for mid_text, neighbours, result in rows:
        lo, hi = (float(v) for v in neighbours.split(","))
        i = mags.index(lo)
        assert mags[i + 1] == hi, f"{mid_text}: {neighbours} are not neighbours"
        assert (lo + hi) / 2 == float(mid_text), f"{mid_text} is not the midpoint of {neighbours}"
        even = lo if i % 2 == 0 else hi  # the neighbour whose code is even
        assert float(result) == even, f"{mid_text} -> {result}: not the even neighbour"
        q = np.array([float(mid_text)], dtype=np.float32)
        code = reference.e2m1_encode(q, np.array([False]))[0]
        assert spec_tables.e2m1_values[code] == float(result), (
            f"reference rounds {mid_text} otherwise"
        )
        if float(result) == hi:
            assert float(mid_text) in spec_tables.e2m1_odd_bounds, f"{mid_text}: not odd-bound"


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    """A tiny evaluator for the prose's formula: integers, the names in ``env``,
    + - * / // %, and ``ceil(...)`` of a scalar. Anything else is refused."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, env)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](evaluate(node.left, env), evaluate(node.right, env))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "ceil"
        and len(node.args) == 1
        and not node.keywords
    ):
        return math.ceil(evaluate(node.args[0], env))
    raise AssertionError(f"swizzle formula: unsupported syntax {ast.dump(node)}")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_swizzle_formula(prose: str) -> None:
    body = section(prose, "128x4 scale swizzle")
    m = re.search(r"^offset\(n, k\) = (.+)$", body, flags=re.MULTILINE)
    assert m, "the swizzle section states `offset(n, k) = ...` in a code block"
    formula = m.group(1).strip()
    assert formula == SWIZZLE_FORMULA
    doc = _squash(spec.swizzle_128x4_offset.__doc__ or "").replace("k_blocks", "kb")
    assert _squash(formula) in doc, "spec.swizzle_128x4_offset's docstring states another formula"
    tree = ast.parse(formula, mode="eval")
    for n_rows, kb in ((1, 1), (7, 3), (128, 4), (129, 5), (300, 13), (513, 9)):
        n, k = np.meshgrid(np.arange(n_rows), np.arange(kb), indexing="ij")
        got: npt.NDArray[np.int64] = evaluate(tree, {"n": n, "k": k, "kb": kb})
        want = spec.swizzle_128x4_offset(n, k, kb)
        np.testing.assert_array_equal(got, want, err_msg=f"N={n_rows} kb={kb}")
        rows, cols = spec.swizzled_scale_shape(n_rows, kb)
        assert len(np.unique(want)) == want.size
        assert want.max() < rows * cols
        band, stride = spec.swizzle_128x4_band(kb)
        assert stride * (rows // spec.SWIZZLE_ROW_TILE) == rows * cols
        tile_of = n // spec.SWIZZLE_ROW_TILE
        banded = tile_of * stride + band.reshape(spec.SWIZZLE_ROW_TILE, kb)[n % 128, k]
        np.testing.assert_array_equal(banded, want, err_msg=f"band N={n_rows} kb={kb}")


def test_phrases(prose: str) -> None:
    def words(text: str) -> str:
        return " ".join(text.split())

    missing = [(s, p) for s, p in PHRASES if words(p) not in words(section(prose, s))]
    assert not missing, f"nvfp4.md no longer states: {missing}"


def test_phrases_from_version(version: str, prose: str) -> None:
    def words(text: str) -> str:
        return " ".join(text.split())

    wanted = [
        (s, p)
        for since, phrases in PHRASES_FROM.items()
        if spec.version_key(version) >= spec.version_key(since)
        for s, p in phrases
    ]
    missing = [(s, p) for s, p in wanted if words(p) not in words(section(prose, s))]
    assert not missing, f"spec/{version}/nvfp4.md does not state: {missing}"


def _example_input(prose: str) -> tuple[npt.NDArray[np.float32], list[list[str]]]:
    rows = tables(section(prose, "Worked example"))[0]
    x = np.zeros((1, 64), dtype=np.float32)
    x[0, :16] = [float(r[1]) for r in rows]
    x[0, 16] = 12.0
    return x, rows


def _dump(prose: str) -> dict[str, str]:
    body = section(prose, "Worked example")
    block = re.search(r"```text\n(.*?)```", body, flags=re.DOTALL)
    assert block, "the worked example has a ```text dump of the stored bytes"
    return {
        k.strip(): v.strip()
        for k, v in (ln.split("=", 1) for ln in block.group(1).splitlines() if "=" in ln)
    }


def _hex_bytes(text: str) -> bytes:
    return bytes(int(b, 16) for b in text.split())


def _f32_bits(text: str) -> int:
    return int(text.split()[0], 16)


def _bits(v: Any) -> int:
    return int(np.asarray(v, dtype=np.float32).reshape(()).view(np.uint32))


def test_worked_example(prose: str) -> None:
    x, rows = _example_input(prose)
    assert len(rows) == 16
    assert np.abs(x[0, :16]).max() == 3.0
    p = reference.quantize(x)
    codes = reference.unpack_codes(p.codes)[0]
    decoded = reference.dequantize(p)[0]
    for i, xv, qv, code, dec in rows:
        j = int(i)
        assert int(code) == codes[j], (
            f"element {i} (x={xv}): prose code {code}, reference {codes[j]}"
        )
        assert np.float32(dec) == decoded[j], (
            f"element {i}: prose decodes to {dec}, reference {decoded[j]!r}"
        )
        q = np.float32(xv) / np.float32(0.5)
        assert np.float32(qv) == q, f"element {i}: prose q {qv}"
    assert "12.000001" in section(prose, "Worked example")
    assert decoded[16] == np.float32("12.000001")

    d = _dump(prose)
    g = p.global_scale
    assert _hex_bytes(d["modelopt.weight"]) == p.codes.tobytes()
    assert (
        _hex_bytes(d["modelopt.weight_scale"])
        == p.scales.tobytes()
        == bytes([0x6E, 0x7E, 0x38, 0x38])
    )
    assert (
        _f32_bits(d["modelopt.weight_scale_2"])
        == _bits(g)
        == _bits(np.float32(12) / np.float32(2688))
    )
    assert _f32_bits(d["compressed_tensors.weight_global_scale"]) == _bits(1.0 / np.float64(g))
    words = [int(w, 16) for w in d["mlx.weight"].split()]
    assert words == p.codes[0].view("<u4").tolist()
    assert _f32_bits(d["mlx.global_scale_argument"]) == _bits(
        g * np.float32(spec.GLOBAL_AMAX_DIVISOR)
    )
    gguf = _hex_bytes(d["gguf.weight"])
    assert len(gguf) == spec.GGUF_BLOCK_BYTES
    assert gguf[:4] == bytes(p.scales[0] & 0x7F)
    c = codes.reshape(4, 16)
    assert gguf[4:] == bytes((c[:, :8] | (c[:, 8:] << 4)).astype(np.uint8).reshape(-1))
    assert _f32_bits(d["gguf.scale"]) == _bits(g)
    rows_p, cols_p = spec.swizzled_scale_shape(1, 4)
    buf = np.zeros(rows_p * cols_p, dtype=np.uint8)
    buf[spec.swizzle_128x4_offset(np.zeros(4, np.int64), np.arange(4), 4)] = p.scales[0]
    assert buf.size == 512
    assert _hex_bytes(d["swizzle_128x4.scales[0:4]"]) == buf[:4].tobytes()
    assert int(spec.swizzle_128x4_offset(np.array(33), np.array(2), 4)) == 22


def test_worked_example_gguf_bytes_decode_with_gguf_py(prose: str) -> None:
    """Independent oracle: gguf-py decodes the prose's GGUF super-block to e2m1 * e4m3."""
    quants = pytest.importorskip("gguf.quants")
    x, _ = _example_input(prose)
    block = np.frombuffer(_hex_bytes(_dump(prose)["gguf.weight"]), dtype=np.uint8).reshape(1, -1)
    got = quants.NVFP4.dequantize_blocks(block).reshape(1, 64)
    np.testing.assert_array_equal(got, reference.dequantize_unscaled(reference.quantize(x)))


# ------------------------------------------------------------------- (c) versions
def test_version_everywhere(
    version: str, spec_dir: Path, prose: str, toml_data: dict[str, Any]
) -> None:
    assert spec_dir.name == version
    assert version in spec.SUPPORTED_SPEC_VERSIONS
    assert nvfp4.require_spec(version) == version
    assert nvfp4.SPEC_VERSION == spec.SPEC_VERSION == spec.SUPPORTED_SPEC_VERSIONS[-1]
    m = re.search(r"^Version: (\S+)$", prose, flags=re.MULTILINE)
    assert m, "nvfp4.md states `Version: <X.Y>`"
    assert m.group(1) == version, f"spec/{version}/nvfp4.md states Version {m.group(1)}"
    assert toml_data["spec_version"] == version
    changelog = (spec_dir / "changelog.md").read_text(encoding="utf-8")
    entry = re.search(
        rf"^## {re.escape(version)} - (\d{{4}}-\d{{2}}-\d{{2}})$",
        changelog,
        flags=re.MULTILINE,
    )
    assert entry, f"changelog.md has no `## {version} - YYYY-MM-DD` entry"
    date = re.search(r"^Date: (\S+)$", prose, flags=re.MULTILINE)
    assert date, "nvfp4.md states `Date: YYYY-MM-DD`"
    assert date.group(1) == entry.group(1), "nvfp4.md's Date differs from the changelog's"
    assert re.search(r"^## Errata$", changelog, flags=re.MULTILINE), (
        "changelog.md lacks `## Errata`"
    )


# ------------------------------------------------------------------- (d) headings
def test_required_headings(prose: str, version: str) -> None:
    titles = [t for _, t, _ in headings(prose)]
    missing = [h for h in required_headings(version) if h not in titles]
    assert not missing, f"nvfp4.md lacks the headings {missing}"
    duplicated = {t for t in titles if titles.count(t) > 1}
    assert not duplicated, f"ambiguous headings in nvfp4.md: {duplicated}"


def test_cited_sections_exist() -> None:
    """Every ``spec X.Y, "Section"`` cited in nvfp4-core's code and scripts is a heading of
    ``spec/X.Y/nvfp4.md`` (a title a docstring breaks over two lines read as one line)."""
    core = Path(nvfp4.__file__).resolve().parent
    root = _repo_root()
    files = sorted(core.rglob("*.py")) + sorted((root / "packages/nvfp4-core/scripts").glob("*.py"))
    cite = re.compile(r'spec (\d+\.\d+),? (?:section )?"([^"]+)"')
    cited = {
        (f.name, m.group(1), " ".join(m.group(2).split()))
        for f in files
        for m in cite.finditer(f.read_text(encoding="utf-8"))
    }
    assert cited, "expected nvfp4-core to cite spec sections"
    titles: dict[str, set[str]] = {}
    for v in {v for _, v, _ in cited}:
        md = root / "spec" / v / "nvfp4.md"
        assert md.is_file(), f"code cites spec {v}, which has no released folder"
        titles[v] = {t for _, t, _ in headings(md.read_text(encoding="utf-8"))}
    dangling = sorted((f, v, t) for f, v, t in cited if t not in titles[v])
    assert not dangling, f"cited sections missing from nvfp4.md: {dangling}"


# ------------------------------------------------------------- (e) spec/README.md
_CURRENT = re.compile(
    r"The normative text of the current version is\s+\[`([^`]+)/nvfp4\.md`\]\(([^)]+)/nvfp4\.md\)"
    r"\.\s+Its numbers are in\s+\[`([^`]+)/tolerances\.toml`\]\(([^)]+)/tolerances\.toml\)"
)


def test_readme_calls_the_newest_version_current() -> None:
    """``spec/README.md`` names ``SPEC_VERSION`` as the current version (its prose and its
    links), and its layout lists every released folder."""
    text = (_repo_root() / "spec" / "README.md").read_text(encoding="utf-8")
    m = _CURRENT.search(text)
    assert m, "spec/README.md no longer says `The normative text of the current version is ...`"
    assert set(m.groups()) == {spec.SPEC_VERSION}, (
        f"spec/README.md calls {sorted(set(m.groups()))} current; the newest released version "
        f"is {spec.SPEC_VERSION}"
    )
    layout = re.search(r"```(?:text)?\nspec/\n(.*?)```", text, flags=re.DOTALL)
    assert layout, "spec/README.md has a ```spec/ ...``` layout block"
    listed = re.findall(r"^  (\d+\.\d+)/ ", layout.group(1), flags=re.MULTILINE)
    assert listed == released_folders(_repo_root()), f"the layout lists {listed}"
