"""The suite against deliberately broken backends: each must fail the right tiers, with a
message that points at its defect; a correct backend that lacks a capability passes with
that capability "not certified"; an undeclared skip, an unavailable backend or a missing
one fails the run.

The suite runs in-process (``pytester``) on the installed ``nvfp4_conformance.tiers``; the
test-only backends (``broken_backends.py``) are registered through an entry point like real
ones and found through ``nvfp4.get_backend``. Assertions read the certificate JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from broken_backends import BACKENDS
from nvfp4.spec import SPEC_VERSION

MODULE = "nvfp4_broken_backends"
Run = Callable[..., tuple[pytest.RunResult, dict[str, Any]]]


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, on ``sys.path``, installs the test-only backends."""
    site = tmp_path_factory.mktemp("site")
    shutil.copy(Path(__file__).with_name("broken_backends.py"), site / f"{MODULE}.py")
    dist = site / "nvfp4_broken_backends-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvfp4-broken-backends\nVersion: 0.0.0\n", encoding="utf-8"
    )
    lines = [f"{name} = {MODULE}:{cls.__name__}" for name, cls in BACKENDS.items()]
    (dist / "entry_points.txt").write_text(
        "[nvfp4.backends]\n" + "\n".join(lines) + "\n", encoding="utf-8"
    )
    return site


@pytest.fixture
def run_suite(
    run_tiers: Callable[..., tuple[pytest.RunResult, dict[str, Any]]],
    broken_site: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Run:
    """``run_suite(backend, tiers, *extra)``: ``run_tiers`` (conftest) with the test-only
    backends installed, on the tiers ``tiers`` (``--nvfp4-tiers``)."""
    monkeypatch.syspath_prepend(str(broken_site))

    def run(backend: str, tiers: str, *extra: str) -> tuple[pytest.RunResult, dict[str, Any]]:
        return run_tiers(backend, f"--nvfp4-tiers={tiers}", *extra)

    return run


def _by_outcome(
    cert: dict[str, Any], outcome: str, tier: str | None = None
) -> dict[str, dict[str, Any]]:
    return {
        t["nodeid"]: t
        for t in cert["tests"]
        if t["outcome"] == outcome and (tier is None or t["tier"] == tier)
    }


def _tiers_with(cert: dict[str, Any], outcome: str) -> set[str]:
    return {t["tier"] for t in cert["tests"] if t["outcome"] == outcome}


# ----------------------------------------------------------------------- the baseline
def test_reference_passes_t0_to_t5_and_certificate_has_figures(run_suite: Run) -> None:
    result, cert = run_suite("reference", "T0,T1,T2,T3,T4,T5")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert cert["result"] == "partial"  # T6 was deselected
    assert cert["backend"]["name"] == "reference"
    assert cert["device"] == "numpy on the CPU"
    assert cert["spec_version"] == SPEC_VERSION  # the newest: suite, core and backend share it
    assert not _by_outcome(cert, "failed")
    assert not _by_outcome(cert, "skipped")
    qmm = [t for t in cert["tests"] if "test_qmm[" in t["nodeid"]]
    assert qmm
    assert all(t["cases"] for t in qmm)
    for t in qmm:
        case = t["cases"][0]
        assert {"max_abs_err", "max_rel_err", "max_ref", "tolerance", "dtype"} <= set(case)
        assert case["max_rel_err"] <= case["tolerance"]


# --------------------------------------------------------------------- broken backends
def test_flipped_code_fails_codec_decode_and_matmul(run_suite: Run) -> None:
    result, cert = run_suite("broken-flip-code", "T0,T1,T2,T3,T4,T5")
    assert result.ret == 1
    assert cert["result"] == "failed"
    assert _tiers_with(cert, "failed") == {"T0", "T3", "T4", "T5"}
    assert not _by_outcome(cert, "failed", "T1")
    assert not _by_outcome(cert, "failed", "T2")
    t0 = _by_outcome(cert, "failed", "T0")
    codes = next(t for n, t in t0.items() if "test_all_e2m1_codes[dequantize]" in n)
    assert "code 5 (0b0101) decodes as 4.0, spec says 3.0" in codes["message"]
    assert "test_invalid_scale_bytes_refused" not in " ".join(t0)
    assert cert["capabilities"]["dequantize"]["state"] == "failed"
    assert cert["capabilities"]["qmm"]["state"] == "failed"
    assert cert["capabilities"]["quantize_activations"]["state"] == "partial"


def test_flipped_code_is_incompatible_its_failures_unexplained(run_suite: Run) -> None:
    """A defect no declared deviation emulates stays a failure: class incompatible, every
    failing test ``explained_by`` null."""
    result, cert = run_suite("broken-flip-code", "T3")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed")
    assert failed
    assert all(t["explained_by"] is None for t in failed.values())
    assert cert["verdict"]["class"] == "incompatible"
    assert sorted(cert["verdict"]["unexplained"]) == sorted(failed)
    assert cert["verdict"]["explained"] == {}


def test_scale_times_global_first_is_attributed_and_compatible(run_suite: Run) -> None:
    """A backend that multiplies scale x global first fails T3 (the spec says exact) and
    every failure is attributed to the declared deviation by emulation: class compatible.
    The tolerance is untouched: the run still fails."""
    result, cert = run_suite("test-scale-global-first", "T3")
    assert result.ret == 1
    assert cert["result"] == "failed"
    failed = _by_outcome(cert, "failed", "T3")
    assert len(failed) >= 5
    for nodeid, t in failed.items():
        assert t["explained_by"] == ["scale_times_global_first"], nodeid
        assert "elements differ (exact match required)" in t["message"]
    assert cert["verdict"] == {
        "class": "compatible",
        "explained": {"scale_times_global_first": len(failed)},
        "unexplained": [],
        "unsafe": [],
        "registry_spec_version": "1.5",
    }
    assert all(t["explained_by"] is None for t in cert["tests"] if t["outcome"] == "passed")


def test_dropped_global_fails_partitions_and_experts_only(run_suite: Run) -> None:
    result, cert = run_suite("broken-drop-global", "T0,T1,T3,T4")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed")
    assert not _by_outcome(cert, "failed", "T0")
    assert not _by_outcome(cert, "failed", "T1")
    assert all("test_qmm[" not in n for n in failed), "plain qmm (one global) must still pass"
    fused = [t for n, t in failed.items() if "test_qmm_fused_partitions" in n]
    gather = [t for n, t in failed.items() if "test_gather_qmm[" in n]
    assert len(fused) == 9
    assert len(gather) == 30
    assert "was scaled by partition 0 (rows 0.." in fused[0]["message"]
    assert "was scaled by expert 0's global" in gather[0]["message"]
    t3 = {n for n in _by_outcome(cert, "failed", "T3") if "property" not in n}
    assert t3
    assert all(("partition" in n or "expert" in n) for n in t3)
    assert "global" in next(iter(_by_outcome(cert, "failed", "T3").values()))["message"]


def test_ignored_out_of_range_ids_fail_gather_only(run_suite: Run) -> None:
    result, cert = run_suite("broken-ignore-out-of-range", "T4,T5")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed")
    assert failed, sorted(failed)
    assert all("gather" in n for n in failed), sorted(failed)
    assert any("per_expert_gather-gather_qmm" in n for n in failed)
    msg = next(t["message"] for n, t in failed.items() if "test_gather_qmm[" in n)
    assert "out-of-range expert id must be exactly zero" in msg


def test_x_rounded_to_a_narrower_type_fails_the_precision_case(run_suite: Run) -> None:
    """float32 x through TF32, float16 through bfloat16 and bfloat16 through float16: the
    pass-through case fails for each dtype, with its figures in the certificate."""
    result, cert = run_suite("broken-narrow-x", "T4", "-k", "test_qmm")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed")
    precision = {n: t for n, t in failed.items() if "test_qmm_keeps_the_precision_of_x" in n}
    assert {n.rsplit("[", 1)[1] for n in precision} == {"float32]", "float16]", "bfloat16]"}
    assert all("x kept at" in t["message"] for t in precision.values())
    # the realistic cases catch most rounding of float32 and float16 x, but bfloat16 x taken
    # through float16 changes nothing inside float16's range: only the new case sees it
    plain = {n: "failed" for n in failed if "test_qmm[" in n}
    plain |= {n: "passed" for n in _by_outcome(cert, "passed") if "test_qmm[" in n}
    for dtype, least_failed in (("float32", 10), ("float16", 10)):
        outcomes = [o for n, o in plain.items() if n.endswith(f"-{dtype}]")]
        assert outcomes.count("failed") >= least_failed, (dtype, outcomes)
    bf16 = [o for n, o in plain.items() if n.endswith("-bfloat16]")]
    assert bf16 == ["passed"] * 15


def test_a_backend_cannot_skip_validation(run_suite: Run) -> None:
    """A kernels object whose prepare would take anything still passes the refusal tiers:
    core validates structure and content before any backend sees the planes."""
    result, cert = run_suite("broken-lax-prepare", "T0,T1")
    assert result.ret == 0, result.stdout.str()[-3000:]
    passed = set(_by_outcome(cert, "passed"))
    assert any("test_invalid_scale_bytes_refused" in n for n in passed)
    assert any("test_prepare_refuses_malformed_content" in n for n in passed)
    assert any("test_prepare_refuses_malformed_structure" in n for n in passed)


def test_other_tie_rule_is_a_counted_boundary_disagreement(run_suite: Run) -> None:
    """An encoder rounding exact midpoints toward zero conforms; the certificate counts its
    disagreements on the midpoint cases."""
    result, cert = run_suite("test-ties-down", "T2,T4")
    assert result.ret == 0, result.stdout.str()[-3000:]
    cases = {c["case"]: c for t in cert["tests"] if t["tier"] == "T2" for c in t["cases"]}
    assert cases["ties_static_scale"]["disagreements"] > 0
    assert (
        cases["ties_static_scale"]["disagreements"]
        == cases["ties_static_scale"]["code_disagreements"]
    )
    assert cases["random corpus"]["elements"] >= 2**20


def test_wrong_encoder_boundary_fails_t2(run_suite: Run) -> None:
    result, cert = run_suite("broken-encoder-boundary", "T2")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed", "T2")
    assert any("random_corpus" in n for n in failed)
    msg = next(t["message"] for n, t in failed.items() if "random_corpus" in n)
    assert "not a boundary disagreement" in msg
    assert "code 5" in msg


# ---------------------------------------------------------------- W4A8 golden (T5)
def _w4a8_golden(encoder: str) -> set[str]:
    """The T5 test ids of the W4A8 golden cases whose ops need ``encoder``'s capability."""
    from nvfp4.fixtures import list_cases

    ops = {
        "w4a8": ("quantize_activations_q8", "qmm_w4a8", "gather_qmm_w4a8"),
        "w4a8_fp8": ("quantize_activations_fp8", "qmm_w4a8_fp8"),
    }[encoder]
    return {
        f"test_golden[{c['name']}-{op}]"
        for c in list_cases()
        for op in ops
        if any(a.get("op") == op for a in c["arrays"].values())
    }


def _t5_ids(tests: dict[str, dict[str, Any]]) -> set[str]:
    return {n.split("::", 1)[1] for n in tests}


def test_q8_codes_rounded_toward_zero_fail_t5_w4a8_only(run_suite: Run) -> None:
    """An int8 encoder that truncates ``x * id`` (codes one too small) fails every W4A8
    int8 golden case - the encoder cases as a code that is not a boundary disagreement, the
    matmuls beyond [w4a8] - while spec 1.0's cases and the FP8 ones pass."""
    result, cert = run_suite("broken-q8-toward-zero", "T5")
    assert result.ret == 1
    failed = _t5_ids(_by_outcome(cert, "failed", "T5"))
    assert failed == _w4a8_golden("w4a8"), sorted(failed)
    assert len(failed) == 7
    passed = _t5_ids(_by_outcome(cert, "passed", "T5"))
    assert _w4a8_golden("w4a8_fp8") <= passed
    assert any("per_expert_gather-gather_qmm" in n for n in passed)
    msgs = {n.split("::", 1)[1]: t["message"] for n, t in _by_outcome(cert, "failed").items()}
    enc = msgs["test_golden[w4a8_q8_rounding-quantize_activations_q8]"]
    assert "w4a8_q8_rounding: quantize_activations_q8 -> q8: code at" in enc
    assert "not a boundary disagreement" in enc
    mm = msgs["test_golden[w4a8_qmm_n33_k512-qmm_w4a8]"]
    assert "qmm_w4a8 -> k512_w4a8_y: max|err|/max|ref| over the outputs beyond their" in mm
    assert "> tolerance 1e-05" in mm
    assert cert["capabilities"]["w4a8"]["state"] == "failed"
    assert cert["capabilities"]["w4a8_fp8"]["state"] == "partial"


def test_fp8_codes_rounded_toward_zero_fail_t5_fp8_only(run_suite: Run) -> None:
    result, cert = run_suite("broken-fp8-toward-zero", "T5")
    assert result.ret == 1
    failed = _t5_ids(_by_outcome(cert, "failed", "T5"))
    assert failed == _w4a8_golden("w4a8_fp8"), sorted(failed)
    assert _w4a8_golden("w4a8") <= _t5_ids(_by_outcome(cert, "passed", "T5"))
    msg = next(
        t["message"]
        for n, t in _by_outcome(cert, "failed").items()
        if "w4a8_fp8_rounding-quantize_activations_fp8" in n
    )
    assert "FP8 code at (0, " in msg
    assert "(e4m3, RNE, saturating at 448)" in msg
    assert cert["capabilities"]["w4a8_fp8"]["state"] == "failed"


def test_q8_ties_to_even_conforms_in_t5(run_suite: Run) -> None:
    """ggml's SIMD tie rule (half to even) conforms: the tie case counts its midpoints as
    boundary disagreements, and the matmul fixtures, clear of every midpoint, pass."""
    result, cert = run_suite("test-q8-ties-even", "T5")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert _w4a8_golden("w4a8") <= _t5_ids(_by_outcome(cert, "passed", "T5"))
    cases = {
        c["case"]: c
        for t in cert["tests"]
        if "test_golden[w4a8_" in t["nodeid"]
        for c in t["cases"]
        if c.get("encoder") == "int8"
    }
    assert cases["q8"]["disagreements"] > 0  # 0.5 -> 0, 2.5 -> 2, ... on the tie case
    assert {cases[k]["disagreements"] for k in ("k32", "k512", "gather")} == {0}


# ---------------------------------------------------------------------- skips, errors
def test_undeclared_skip_fails_the_run(run_suite: Run) -> None:
    result, cert = run_suite("broken-skipper", "T0")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*skip without a declared missing capability*"])
    assert cert["result"] == "failed"
    assert cert["illegal_skips"]
    assert all("dequantize" in n for n in cert["illegal_skips"])
    assert cert["capabilities"]["dequantize"]["state"] == "failed"


def test_missing_capability_is_skipped_and_not_certified(run_suite: Run) -> None:
    result, cert = run_suite("test-no-w4a4", "T4")
    assert result.ret == 0, result.stdout.str()[-3000:]
    skipped = _by_outcome(cert, "skipped")
    assert skipped
    assert all("w4a4" in n for n in skipped)
    assert all(t["skip_kind"] == "capability" for t in skipped.values())
    assert cert["capabilities"]["w4a4"] == {
        "state": "not certified",
        "why": "not declared by the backend",
    }
    assert "w4a4" in cert["capabilities_not_certified"]
    assert not cert["illegal_skips"]


def test_unavailable_backend_is_a_usage_error(run_suite: Run) -> None:
    result, cert = run_suite("test-unavailable", "T0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test-unavailable*XPU-9000*"])
    assert cert == {}


def test_uninstalled_backend_is_a_usage_error(run_suite: Run) -> None:
    result, _ = run_suite("no-such-backend", "T0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no-such-backend*not installed*"])


def test_unknown_spec_version_is_a_usage_error(run_suite: Run) -> None:
    result, _ = run_suite("reference", "T0", "--nvfp4-spec=9.9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nvfp4-spec 9.9*"])


def test_no_backend_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVFP4_BACKEND", raising=False)
    result = pytester.runpytest("--pyargs", "nvfp4_conformance.tiers", "--nvfp4-tiers=T0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*need a backend*--nvfp4-backend*"])


def test_plugin_is_inert_in_other_test_sessions(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed, the plugin loads in every pytest run; without the tiers it does nothing
    (even with NVFP4_BACKEND naming an unavailable backend)."""
    monkeypatch.setenv("NVFP4_BACKEND", "test-unavailable")
    pytester.makepyfile("def test_unrelated():\n    assert True\n")
    result = pytester.runpytest()
    assert result.ret == 0
    assert "NVFP4 conformance" not in result.stdout.str()


# --------------------------------------------------------------------------- the CLI
def test_run_command_writes_both_certificate_files(
    tmp_path: Path, run_command: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    cert = tmp_path / "reports" / "conformance-reference.json"
    proc = run_command(cert, "--nvfp4-tiers=T0", "-q", triton_interpret=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(cert.read_text(encoding="utf-8"))
    md = cert.with_suffix(".md").read_text(encoding="utf-8")
    # TRITON_INTERPRET=1 is reported as such, never as a device name
    assert data["device"] == "Triton interpreter on CPU"
    assert "| device | Triton interpreter on CPU |" in md
    assert data["imported_from"]["nvfp4_conformance"].endswith("__init__.py")
    assert "certificate written" in proc.stdout


def test_a_case_a_backend_raises_on_fails_alone_in_t7(run_suite: Run) -> None:
    """T7 runs every case on the ranks of one spawn: a backend that raises on one case (an
    expert id outside a rank's experts) fails that case's tests with its message, and every
    other case is still judged (each rank joins the collectives with zeros)."""
    pytest.importorskip("nvfp4_torch.ranks")  # the parity extra (torch)
    result, cert = run_suite("broken-refuse-out-of-range", "T7", "-k", "not greedy_parity")
    assert result.ret == 1
    failed = _by_outcome(cert, "failed", "T7")
    assert failed
    assert all("test_expert_parallel_gather_qmm[" in n for n in failed), sorted(failed)
    for t in failed.values():
        assert "the backend raised on rank " in t["message"]
        assert "ValueError: gather_qmm: an expert id outside [0, " in t["message"]
    passed = _by_outcome(cert, "passed", "T7")
    assert any("test_row_parallel_qmm[" in n for n in passed)
    assert any("test_column_parallel_qmm[" in n for n in passed)
    assert not _by_outcome(cert, "error", "T7")


def test_partials_in_x_dtype_are_explained_in_t7_and_compatible(run_suite: Run) -> None:
    """A backend whose partials come back in x's dtype (as torchao's) fails only the
    row-parallel sums whose partials cancel, in float16 / bfloat16; it declares spec 1.5's
    ``partials_in_activation_dtype``, every such failure is within that deviation's bound
    (each records the fraction of it used), so the certificate's class is compatible, not
    incompatible."""
    pytest.importorskip("nvfp4_torch.ranks")  # the parity extra (torch)
    result, cert = run_suite("test-partials-in-x-dtype", "T7", "-k", "row_parallel")
    assert result.ret == 1
    assert cert["spec_version"] == "1.5"
    failed = _by_outcome(cert, "failed", "T7")
    assert failed
    for nodeid, t in failed.items():
        assert "test_row_parallel_qmm_cancelling[" in nodeid, nodeid
        assert "float32]" not in nodeid, nodeid
        assert t["explained_by"] == ["partials_in_activation_dtype"], nodeid
        # the failing case records how much of the bound it uses: within it, and not nothing
        used = t["cases"][-1]["bound_used"]["partials_in_activation_dtype"]
        assert 0 < used <= 1, (nodeid, used)
    assert any("test_row_parallel_qmm[" in n for n in _by_outcome(cert, "passed", "T7"))
    v = cert["verdict"]
    assert (v["class"], v["unexplained"], v["registry_spec_version"]) == ("compatible", [], "1.5")
    assert v["explained"] == {"partials_in_activation_dtype": len(failed)}
