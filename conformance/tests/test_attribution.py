"""``nvfp4_conformance.attribution``: a refusal is explained by the narrowest emulated
refusal that makes it, a decode by the deviation whose emulation gives it exactly, only
among the deviations the registry declares for the backend under test, and the verdict
follows the registry's severities."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from nvfp4 import deviation_emulators as emu
from nvfp4 import reference
from nvfp4_conformance import attribution


@pytest.fixture(autouse=True)
def _every_deviation() -> Iterator[None]:
    """Each test starts from "every deviation takes part" (what a run outside the plugin
    sees), whatever a certification run earlier in this process declared, and leaves it so."""
    attribution.declare_for(None)
    yield
    attribution.declare_for(None)


def _refusal(k: int) -> list[str] | None:
    planes = reference.quantize_activations(np.ones((2, k), np.float32))
    return attribution.explain_refusal(lambda d: emu.dequantize(planes, "float32", deviations=d))


def test_the_narrowest_refusal_explains() -> None:
    assert _refusal(48) == ["mlx_k_multiple_of_32"]  # not a multiple of 64 either
    assert _refusal(32) == ["k_multiple_of_64"]
    assert _refusal(64) is None  # nothing refuses it: a refusal there is unexplained


def test_a_decode_is_explained_by_its_emulation_only() -> None:
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    planes = reference.quantize_activations(x)
    first = emu.dequantize(planes, "float32", deviations=["scale_times_global_first"])
    assert attribution.explain_dequantize(first, planes, "float32") == ["scale_times_global_first"]
    wrong = reference.dequantize(planes).copy()
    wrong[0, 0] *= 2
    assert attribution.explain_dequantize(wrong, planes, "float32") is None


def test_the_verdict_follows_the_registry() -> None:
    ok = {"nodeid": "a", "outcome": "passed", "explained_by": None}
    assert attribution.verdict([ok], "certified")["class"] == "conformant"
    benign = {"nodeid": "b", "outcome": "failed", "explained_by": ["scale_times_global_first"]}
    assert attribution.verdict([ok, benign], "failed")["class"] == "compatible"
    unsafe = {"nodeid": "c", "outcome": "failed", "explained_by": ["out_of_range_expert_id"]}
    v = attribution.verdict([benign, unsafe], "failed")
    assert v["class"] == "incompatible"
    assert v["unsafe"] == ["out_of_range_expert_id"]
    bug = {"nodeid": "d", "outcome": "failed", "explained_by": None}
    v = attribution.verdict([benign, bug], "failed")
    assert v["class"] == "incompatible"
    assert v["unexplained"] == ["d"]


@pytest.fixture
def declared() -> Iterator[Callable[[str], frozenset[str] | None]]:
    """``attribution.declare_for`` for one test, every deviation again after it."""
    yield attribution.declare_for
    attribution.declare_for(None)


def test_a_failure_is_explained_by_its_own_engines_deviations_only(
    declared: Callable[[str], frozenset[str] | None],
) -> None:
    # K = 48: ggml's and MLX's refusals both make it; each engine gets its own
    assert "k_multiple_of_64" in (declared("ggml") or ())
    assert _refusal(48) == ["k_multiple_of_64"]
    assert "mlx_k_multiple_of_32" in (declared("mlx-native") or ())
    assert _refusal(48) == ["mlx_k_multiple_of_32"]
    # an MLX refusal its own emulation does not make is a bug, not ggml's deviation
    assert _refusal(32) is None
    # a backend the registry names nowhere has no declared deviation
    assert declared("cpu") == frozenset()
    assert _refusal(48) is None
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    planes = reference.quantize_activations(x)
    first = emu.dequantize(planes, "float32", deviations=["scale_times_global_first"])
    assert attribution.explain_dequantize(first, planes, "float32") is None
    declared("torchao")
    assert attribution.explain_dequantize(first, planes, "float32") == ["scale_times_global_first"]


def test_a_backend_declares_registry_deviations_only(
    declared: Callable[..., frozenset[str] | None],
) -> None:
    assert declared("my-engine", ["scale_times_global_first"]) == {"scale_times_global_first"}
    with pytest.raises(ValueError, match="does not hold: made_up"):
        declared("my-engine", ["made_up"])


def test_a_hypothesis_test_is_explained_only_when_every_failing_example_is() -> None:
    passing = {"case": "m1_k16_sNone", "max_abs_err": 0.0}  # a passing example: no key

    def test(*failing: list[str] | None) -> dict[str, object]:
        cases = [passing, *({"case": "m2", "explained_by": ids} for ids in failing), passing]
        return {"nodeid": "p", "outcome": "failed", "hypothesis": True, "cases": cases}

    a, b = ["scale_times_global_first"], ["ct_encode_global"]
    assert attribution.failing_explanation(test(a, a)) == a
    # two distinct failures, each explained: both deviations, in order
    assert attribution.failing_explanation(test(a, b, a)) == [*a, *b]
    # one example nothing explains leaves the test unexplained, wherever it ran
    assert attribution.failing_explanation(test(None, a)) is None
    assert attribution.failing_explanation(test(a, None)) is None
    assert attribution.failing_explanation(test(a, [])) is None
    assert attribution.failing_explanation(test()) is None  # failed with no example recorded
    # a test that is not Hypothesis's answers by its last case, as before
    plain = {"nodeid": "q", "outcome": "failed", "cases": [{"case": "c", "explained_by": None}]}
    plain["cases"].append({"case": "d", "explained_by": a})
    assert attribution.failing_explanation(plain) == a


def test_a_group_of_failures_keeps_each_error_s_first_line() -> None:
    """Hypothesis's "distinct failures" arrive as one exception group; the certificate's
    message names every error in it, not the group's line alone."""
    from nvfp4_conformance.plugin import _short_message

    try:
        group = ExceptionGroup  # Python 3.11 on
    except NameError:  # Python 3.10: the backport Hypothesis depends on there
        from exceptiongroup import ExceptionGroup as group

    def fail() -> None:
        errors = [AssertionError("codes differ at (0, 3)\nmore"), ValueError("K = 48 refused")]
        raise group("Hypothesis found 2 distinct failures.", errors)

    call = pytest.CallInfo.from_call(fail, when="call")
    lines = _short_message(call).splitlines()
    assert lines[0].startswith("ExceptionGroup: Hypothesis found 2 distinct failures.")
    assert "  [1] AssertionError: codes differ at (0, 3)" in lines
    assert "  [2] ValueError: K = 48 refused" in lines
    assert "more" not in lines


def _cancelling_sum(world: int, dtype: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``(y, ref, partials)``: a row-parallel sum of partials that cancel, each rounded to
    ``dtype`` (the deviation's arithmetic), its reference and the exact partials."""
    from nvfp4.testing import cancelling_halves

    x, w = cancelling_halves(np.random.default_rng(world), 2, 4, 64 * world, depth=(6.0, 12.0))
    full = reference.dequantize(w, "float32").astype(np.float64)
    a = x.astype(np.float64)
    cut = np.linspace(0, a.shape[1], world + 1).astype(int)
    parts = [a[:, i:j] @ full[:, i:j].T for i, j in itertools.pairwise(cut)]
    ref = a @ full.T
    y = emu.row_parallel_sum(parts, dtype, deviations=["partials_in_activation_dtype"])
    return y.astype(np.float64), ref, parts


def test_a_row_parallel_sum_is_explained_within_its_declared_bound_only(
    declared: Callable[..., frozenset[str] | None],
) -> None:
    """Partials rounded to bfloat16: explained for a backend that declares the deviation (or
    that the registry's seen_in names) under spec 1.5, never under 1.4 (1.2's registry has
    no such id), and not an output outside the bound."""
    y, ref, parts = _cancelling_sum(3, "bfloat16")
    assert np.abs(y - ref).max() > 1e-2 * np.abs(ref).max(), "the case departs from the rule"
    what = "partials_in_activation_dtype"
    assert attribution.explain_row_parallel_sum(y, ref, None, parts, "bfloat16") == [what]
    declared("my-engine", (), "1.5")
    assert attribution.explain_row_parallel_sum(y, ref, None, parts, "bfloat16") is None
    declared("torchao", (), "1.5")
    assert attribution.explain_row_parallel_sum(y, ref, None, parts, "bfloat16") == [what]
    declared("my-engine", [what], "1.5")
    assert attribution.explain_row_parallel_sum(y, ref, None, parts, "bfloat16") == [what]
    wrong = y.copy()
    wrong[0, 0] += 2 * emu.partials_relative_bound(parts, "bfloat16", 1.0)[0, 0] + 1.0
    assert attribution.explain_row_parallel_sum(wrong, ref, None, parts, "bfloat16") is None
    nan = y.copy()
    nan[1, 1] = np.nan
    assert attribution.explain_row_parallel_sum(nan, ref, None, parts, "bfloat16") is None
    assert declared("torchao", (), "1.4") is not None
    assert attribution.explain_row_parallel_sum(y, ref, None, parts, "bfloat16") is None
    with pytest.raises(
        ValueError, match=r"does not hold: partials_in_activation_dtype \(registry of spec 1\.2\)"
    ):
        declared("my-engine", [what], "1.4")


def test_the_verdict_names_the_registry_of_the_certified_version() -> None:
    failed = {"nodeid": "t7", "outcome": "failed", "explained_by": ["partials_in_activation_dtype"]}
    assert attribution.verdict([failed], "failed", "1.5")["registry_spec_version"] == "1.5"
    assert attribution.verdict([failed], "failed", "1.5")["class"] == "compatible"
    assert attribution.verdict([], "certified", "1.4")["registry_spec_version"] == "1.2"


def test_row_parallel_bounds_used_measures_the_worst_element_against_its_bound(
    declared: Callable[..., frozenset[str] | None],
) -> None:
    """The fraction of the bound a sum uses: the worst element's error beyond the floor over
    its bound (a fraction in (0, 1] for the deviation's own arithmetic, exactly 1.5 for an
    element moved to 1.5 times its bound, 0 within the floor) and ``inf`` for what no bound
    covers (NaN for a finite reference, another shape); none where nothing is declared."""
    y, ref, parts = _cancelling_sum(4, "float16")
    what = "partials_in_activation_dtype"
    declared("torchao", (), "1.5")
    used = attribution.row_parallel_bounds_used(y, ref, None, parts, "float16")
    assert set(used) == {what}
    assert 0 < used[what] <= 1, used
    bound = emu.partials_relative_bound(parts, "float16", 1.0)
    worse = ref.copy()
    i = np.unravel_index(np.argmax(bound), bound.shape)
    worse[i] += 1.5 * bound[i]
    assert attribution.row_parallel_bounds_used(worse, ref, None, parts, "float16")[
        what
    ] == pytest.approx(1.5, rel=1e-12)
    assert attribution.explain_row_parallel_sum(worse, ref, None, parts, "float16") is None
    floor = np.abs(y - ref)
    assert attribution.row_parallel_bounds_used(y, ref, floor, parts, "float16") == {what: 0.0}
    nan = y.copy()
    nan[0, 0] = np.nan
    assert attribution.row_parallel_bounds_used(nan, ref, None, parts, "float16") == {
        what: float("inf")
    }
    assert attribution.row_parallel_bounds_used(y[:1], ref, None, parts, "float16") == {
        what: float("inf")
    }
    declared("my-engine", (), "1.5")
    assert attribution.row_parallel_bounds_used(y, ref, None, parts, "float16") == {}
    assert attribution.within_bound({}) is None
