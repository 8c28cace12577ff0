"""The drafted upstream reports in ``docs/upstream/`` stay true and complete.

* Every reproducer runs as a script in a subprocess where its engine is installed. It must
  exit 1 and print exactly the ``expected:`` and ``actual:`` lines its report and the
  index quote. When an engine fixes a bug, the reproducer exits 0 and this test fails. Then
  the index records the release ("fixed in X"), the reproducer's entry leaves
  :data:`REPRODUCERS`, and the engine is certified again. An engine that is not installed
  is skipped, unless ``NVFP4_REQUIRE_ENGINES`` names its adapter (conftest.py); then the
  test fails.
* Which deviations need a report. A deviation's ``severity`` decides the class of an engine
  that shows it (spec 1.2, "Conformance classes and declared deviations"): ``benign``
  and ``lossy`` leave an engine ``compatible``, while ``unsafe`` makes it ``incompatible``
  even when the deviation is declared. ``scope`` (real checkpoints or malformed input) does
  not change the class. So an engine bug that makes an engine incompatible is an
  ``unsafe`` deviation, and it is that engine's bug for every adapter in its ``seen_in``.
  Each such (deviation, adapter) pair needs an entry here and a row in the index. Every
  entry here names an ``unsafe`` deviation of an adapter in that deviation's ``seen_in``.
  Failures that no deviation explains have no id to check; the index lists them with
  what they turned out to be.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import ENGINES, REQUIRED
from nvfp4 import deviation_registry as reg

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = ROOT / "docs" / "upstream"
INDEX = UPSTREAM / "README.md"


class Reproducer(NamedTuple):
    adapter: str  # the nvfp4-engines adapter whose certificate found it (a seen_in value)
    deviation: str  # its id in spec/1.2/deviations.toml
    expected: str  # the line after "expected: "
    actual: str  # the line after "actual:   "


#: docs/upstream/<file>.py -> what it is about and what it prints while the bug is there.
REPRODUCERS = {
    "modelopt-zero-amax-global.py": Reproducer(
        "modelopt",
        "zero_amax_global",
        "per-tensor scale 1.0, scale byte 0x38, codes [0], decoded ['0.0']",
        "per-tensor scale 0.0, scale byte 0xff, codes [7], decoded ['nan']",
    ),
    "torchao-zero-amax-global.py": Reproducer(
        "torchao",
        "zero_amax_global",
        "per-tensor scale 1.0, scale byte 0x38, codes [0], decoded ['0.0']",
        "per-tensor scale 0.0, scale byte 0xff, codes [12], decoded ['nan']",
    ),
    "mlx-zero-global-scale.py": Reproducer(
        "mlx-native",
        "mlx_degenerate_global",
        "per-tensor scale 1.0, scale bytes ['0x38', '0x38'] ([1.0]), decoded ['0.0']",
        "per-tensor scale 0.0, scale bytes ['0xfe', '0xfe'] ([-448.0]), decoded ['-0.0']",
    ),
    "mlx-gather-qmm-expert-id-out-of-range.py": Reproducer(
        "mlx-native",
        "out_of_range_expert_id",
        "id 0 -> 192.0, id 1 -> 384.0, id 2 -> 0.0, id 4294967295 -> 0.0 (E = 2)",
        "id 0 -> 192.0, id 1 -> 384.0, id 2 -> 192.0, id 4294967295 -> 96.0",
    ),
    "mlx-quantized-matmul-float16-overflow.py": Reproducer(
        "mlx-native",
        "mlx_low_precision",
        "64.0 (float16; the unscaled sum 172032.0 exceeds 65504)",
        "inf",
    ),
    "ggml-mul-mat-id-expert-id-out-of-range.py": Reproducer(
        "ggml",
        "out_of_range_expert_id",
        "row of expert id 2 (E = 2): [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]",
        "row of expert id 2 (E = 2): [7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0] (compute status 0)",
    ),
}


def _engine_env(adapter: str) -> dict[str, str] | None:
    """The environment a reproducer of this adapter's engine runs in, or None where the
    engine is not installed. For ggml, a folder of ggml's own libraries named by
    NVFP4_GGML_LIB_DIR, or libggml-python, stands in for llama-cpp-python (the reproducer
    reads GGML_LIB_DIR, then tries libggml, then llama_cpp)."""
    env = dict(os.environ)
    if adapter == "ggml" and os.environ.get("NVFP4_GGML_LIB_DIR"):
        env["GGML_LIB_DIR"] = os.environ["NVFP4_GGML_LIB_DIR"]
        return env
    if adapter == "ggml" and importlib.util.find_spec("libggml") is not None:
        return env  # libggml-python's prebuilt libraries, which the reproducer loads first
    return env if importlib.util.find_spec(ENGINES[adapter][1]) is not None else None


def _index_rows() -> list[list[str]]:
    """The cells of the index's first table (engine, bug, deviation, status, reproducer,
    report), backticks removed."""
    text = INDEX.read_text(encoding="utf-8")
    table = text.split("\n\n| engine | bug |", 1)[1].split("\n\n", 1)[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return [[cell.strip().strip("`") for cell in row] for row in rows]


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_reproducer_shows_the_bug(name: str) -> None:
    r = REPRODUCERS[name]
    env = _engine_env(r.adapter)
    if env is None:
        if r.adapter in REQUIRED:
            pytest.fail(f"NVFP4_REQUIRE_ENGINES names {r.adapter!r}, but it is not installed")
        pytest.skip(f"{r.adapter}'s engine ({ENGINES[r.adapter][1]}) is not installed")
    run = subprocess.run(
        [sys.executable, str(UPSTREAM / name)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=UPSTREAM,
    )
    lines = run.stdout.splitlines()
    assert run.returncode == 1, (
        f"{name}: exit status {run.returncode}, expected 1 (0: the engine fixed it); "
        f"stdout {run.stdout!r}, stderr {run.stderr[-500:]!r}"
    )
    assert f"expected: {r.expected}" in lines, f"{name}: stdout {run.stdout!r}"
    assert f"actual:   {r.actual}" in lines, f"{name}: stdout {run.stdout!r}"


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_report_quotes_its_reproducer(name: str) -> None:
    r = REPRODUCERS[name]
    stem = name.removesuffix(".py")
    script = (UPSTREAM / name).read_text(encoding="utf-8")
    report = (UPSTREAM / f"{stem}.md").read_text(encoding="utf-8")
    assert f"expected: {r.expected}" in report, f"{stem}.md does not quote the expected line"
    assert f"actual:   {r.actual}" in report, f"{stem}.md does not quote the actual line"
    assert f"`{r.deviation}`" in report, f"{stem}.md does not name {r.deviation}"
    assert f"docs/upstream/{name}" in report, f"{stem}.md does not name its reproducer"
    imports = set(re.findall(r"^(?:import|from) (\w+)", script, flags=re.M))
    third_party = imports - set(sys.stdlib_module_names)
    allowed = {"numpy", "ml_dtypes", "torch", ENGINES[r.adapter][1]}
    assert third_party <= allowed, f"{name} imports {sorted(third_party - allowed)}"


def test_the_index_lists_every_reproducer_with_its_deviation() -> None:
    rows = _index_rows()
    listed = {row[4]: row for row in rows}
    assert sorted(listed) == sorted(REPRODUCERS), "index rows != the reproducers"
    for name, row in listed.items():
        assert row[2] == REPRODUCERS[name].deviation, (name, row[2])
        assert row[3] == "not yet filed" or row[3].startswith("fixed in "), (name, row[3])
        assert row[5] == f"[report]({name.removesuffix('.py')}.md)", (name, row[5])
        assert (UPSTREAM / name).is_file(), name


def test_every_unsafe_deviation_has_a_report_for_each_engine_it_was_seen_in() -> None:
    """The rule of the module docstring: unsafe deviations x the adapters that show them."""
    unsafe = {d.id: d for d in reg.deviations() if d.severity == "unsafe"}
    needed = {(d.id, adapter) for d in unsafe.values() for adapter in d.seen_in}
    have = {(r.deviation, r.adapter) for r in REPRODUCERS.values()}
    assert needed - have == set(), f"unsafe deviations with no upstream report: {needed - have}"
    assert have - needed == set(), (
        f"reports of no unsafe deviation of their engine: {have - needed}"
    )


def test_the_rule_sees_the_unsafe_deviations_the_matrix_reports() -> None:
    """The registry holds unsafe deviations of these adapters today, so the rule above is
    not empty."""
    seen = {a for d in reg.deviations() if d.severity == "unsafe" for a in d.seen_in}
    assert {"modelopt", "torchao", "mlx-native", "ggml"} <= seen
