"""``nvfp4_conformance.attribution``: a refusal is explained by the narrowest emulated
refusal that makes it, a decode by the deviation whose emulation gives it exactly, only
among the deviations the registry declares for the backend under test, and the verdict
follows the registry's severities."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from nvfp4 import deviation_emulators as emu
from nvfp4 import reference
from nvfp4_conformance import attribution


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
