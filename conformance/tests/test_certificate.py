"""The certificate as people read it: the Markdown rendered from a recorded run
(``data/certificate-reference.json``: the reference backend on T0-T5, trimmed to a few
tests per tier) - the one-screen summary, Hypothesis examples folded into one row, what a
partial run left out and why, the backend's notes, no unreadable values - and a run of the
command line that must print no warning."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nvfp4_conformance.certificate import SCHEMA_VERSION, render_markdown, tier_summary

DATA = Path(__file__).with_name("data") / "certificate-reference.json"


@pytest.fixture
def cert() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def _summary(md: str) -> str:
    """The Markdown above the details."""
    return md.split("\n## ", 1)[0]


def _row(md: str, first_cell: str) -> list[str]:
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r}")


def test_summary_fits_one_screen_and_states_the_result(cert: dict[str, Any]) -> None:
    md = render_markdown(cert)
    summary = _summary(md)
    assert len(summary.splitlines()) <= 45
    assert "**Result: PARTIAL** - the 14 tests that ran passed; 5 tests did not run" in summary
    assert "device: numpy on the CPU" in summary


def test_summary_has_one_row_per_tier_with_counts_worst_error_and_verdict(
    cert: dict[str, Any],
) -> None:
    summary = _summary(render_markdown(cert))
    header = _row(summary, "tier")
    assert header == [
        "tier",
        "tests",
        "passed",
        "failed",
        "skipped",
        "worst error / tolerance",
        "verdict",
    ]
    t4 = _row(summary, "T4 matmul")
    assert t4[1:5] == ["3", "3", "0", "0"]
    # the worst case is the largest fraction of its own tolerance (float16 here, not the
    # bfloat16 case with the larger absolute error)
    assert t4[5].startswith("max_rel_err 0.000374 / 0.001 (37% of it)")
    assert "`test_qmm[M16_K1024_N129-float16]`" in t4[5]
    assert t4[6] == "passed"
    assert _row(summary, "T3 dequantize")[5] == "exact: 0 mismatched elements"
    assert _row(summary, "T2 quantize")[5].startswith("disagreement_fraction 0 / 0 (an exact rule)")
    assert _row(summary, "T1 planes")[5] == "-"
    assert _row(summary, "T6 parity")[1:] == ["0", "0", "0", "0", "-", "not run"]


def test_a_failing_tier_says_so_with_its_worst_error(cert: dict[str, Any]) -> None:
    bad = copy.deepcopy(cert)
    t = next(t for t in bad["tests"] if t["nodeid"].endswith("test_qmm[M16_K1024_N129-bfloat16]"))
    t["outcome"] = "failed"
    t["message"] = "AssertionError: qmm bfloat16: max|y-ref|/max|ref| = 0.5 > 0.01"
    t["cases"][0]["max_rel_err"] = 0.5
    bad["result"] = "failed"
    bad["summary"] = {"passed": 13, "failed": 1}
    bad["tiers"] = tier_summary(bad["tests"], bad["left_out"])
    md = render_markdown(bad)
    assert "**Result: FAILED** - 1 of 14 tests failed." in md
    t4 = _row(_summary(md), "T4 matmul")
    assert t4[1:4] == ["3", "2", "1"]
    assert t4[5].startswith("max_rel_err 0.5 / 0.01 (50 times it)")
    assert t4[6] == "failed"
    assert "max|y-ref|/max|ref| = 0.5 > 0.01" in md


def test_a_failing_test_names_what_explains_it_and_how_much_of_its_bound(
    cert: dict[str, Any],
) -> None:
    """A failing test reads "explained by" its deviations, with the fraction of a bound the
    failing case used where it measured one, or "unexplained"."""
    bad = copy.deepcopy(cert)
    tests = [t for t in bad["tests"] if "test_t4_matmul.py::" in t["nodeid"]]
    for t in tests:
        t["outcome"] = "failed"
        t["message"] = "AssertionError: over the tolerance"
    tests[0]["explained_by"] = ["partials_in_activation_dtype"]
    tests[0]["cases"][-1]["bound_used"] = {"partials_in_activation_dtype": 0.2219}
    tests[1]["explained_by"] = ["scale_times_global_first"]
    tests[2]["explained_by"] = None
    md = render_markdown(bad)
    short = [t["nodeid"].split("::", 1)[1] for t in tests]
    assert f"`{short[0]}` - explained by `partials_in_activation_dtype` (0.22 of its bound)" in md
    assert f"`{short[1]}` - explained by `scale_times_global_first`\n" in md
    assert f"`{short[2]}` - unexplained" in md


def test_partial_run_says_what_was_left_out_and_why(cert: dict[str, Any]) -> None:
    summary = _summary(render_markdown(cert))
    assert "Left out (not run, so not certified):" in summary
    assert "- T6 parity: 5 tests, not selected: --nvfp4-tiers T0,T1,T2,T3,T4,T5" in summary


def test_backend_notes_and_capabilities_are_in_the_summary(cert: dict[str, Any]) -> None:
    cert["backend"]["notes"] = ["tiles: BLOCK_M=64 BLOCK_N=64", "W4A4 emulated"]
    summary = _summary(render_markdown(cert))
    assert "- tiles: BLOCK_M=64 BLOCK_N=64" in summary
    assert "- W4A4 emulated" in summary
    assert "Capabilities certified: none." in summary
    assert _row(summary, "w4a8") == ["w4a8", "not certified", "not declared by the backend"]
    assert _row(summary, "qmm")[1] == "partial"


def test_hypothesis_examples_fold_into_one_row_with_their_count(cert: dict[str, Any]) -> None:
    md = render_markdown(cert)
    row = _row(md, "`test_dequantize_property`")
    assert row[2] == "8 Hypothesis examples"
    # counts are summed over the examples
    t = next(t for t in cert["tests"] if t["nodeid"].endswith("test_dequantize_property"))
    assert f"elements={sum(c['elements'] for c in t['cases'])}" in row[-1]
    assert sum("test_dequantize_property" in line for line in md.splitlines()) == 1
    assert "A Hypothesis test is one row for all its examples" in md


def test_identical_rows_fold_into_one_with_a_count(cert: dict[str, Any]) -> None:
    t = next(
        t for t in cert["tests"] if t["nodeid"].endswith("test_modelopt_round_trip[2d_n7_k64]")
    )
    t["cases"] = t["cases"] * 3
    md = render_markdown(cert)
    assert _row(md, "`test_modelopt_round_trip[2d_n7_k64]`")[2] == "2d_n7_k64 (3 times)"
    assert sum("2d_n7_k64" in line for line in md.splitlines()) == 1


def test_values_render_readably(cert: dict[str, Any]) -> None:
    # a T6 prompt that matched every token (no first mismatch), a skip without a message
    cert["t6"] = {
        "prompts": [
            {
                "case": "prompt 0",
                "kind": "parity",
                "tokens_matched": 40,
                "tokens_expected": 40,
                "first_mismatch": None,
                "min_reference_margin": 0.231,
                "near_tie_threshold": 0.05,
            }
        ],
        "tokens_reproduced": 40,
        "tokens_expected": 40,
    }
    t = next(
        t for t in cert["tests"] if t["nodeid"].endswith("test_qmm_w4a4[M1_K4096_N24-float32]")
    )
    t.update(outcome="skipped", skip_kind="capability", message="", capabilities=["w4a4"])
    md = render_markdown(cert)
    assert "partitions=(0, 16, 24, 32)" in md
    assert "zero_rows=(2, 4, 7)" in md
    assert "wrong_scale_bytes=-" in md
    assert "| prompt 0 | 40/40 | - |" in md
    for glitch in ("0x16x", "2x4x7", "=None", "| None |", "=,", "= ", "=\n", "[]", "['"):
        assert glitch not in md, glitch
    reasons = [line for line in md.splitlines() if "test_qmm_w4a4[M1_K4096_N24-float32]`" in line]
    skip_row = next(line for line in reasons if "needs" in line)
    assert "needs w4a4, which the backend does not declare" in skip_row
    for line in md.splitlines():  # no empty cell in a skip-reason table
        if line.startswith("| `") and "reason" not in line:
            assert not re.search(r"\|\s*\|\s*$", line), line


def test_the_json_names_its_schema_version(cert: dict[str, Any]) -> None:
    assert cert["schema_version"] == 2  # the recorded certificate's form
    assert SCHEMA_VERSION == 4
    assert "certificate_format" not in cert
    assert cert["left_out"] == [
        {"tier": "T6", "tests": 5, "reason": "not selected: --nvfp4-tiers T0,T1,T2,T3,T4,T5"}
    ]
    assert cert["tiers"] == tier_summary(cert["tests"], cert["left_out"])


def test_run_under_the_interpreter_states_why_t6_is_left_out_and_warns_of_nothing(
    tmp_path: Path, run_command: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """``python -m nvfp4_conformance run`` prints no warning (with ``-W error`` any warning
    fails the run), and a certificate without T6 under ``TRITON_INTERPRET=1`` says why."""
    cert = tmp_path / "c.json"
    proc = run_command(cert, "--nvfp4-tiers=T0,T3", "-q", "-W", "error", triton_interpret=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "warning" not in out.lower(), out[-3000:]
    data = json.loads(cert.read_text(encoding="utf-8"))
    t6 = next(e for e in data["left_out"] if e["tier"] == "T6")
    assert "Triton interpreter on CPU" in t6["reason"]
    assert "needs the GPU" in t6["reason"]
    md = cert.with_suffix(".md").read_text(encoding="utf-8")
    # 4 prompts' parity and the quality of w4a4, w4a8 and w4a8_fp8, which the reference declares
    assert "- T6 parity: 8 tests, not selected: --nvfp4-tiers T0,T3 (Triton interpreter" in md
