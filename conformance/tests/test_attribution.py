"""``nvfp4_conformance.attribution``: a refusal is explained by the narrowest emulated
refusal that makes it, a decode by the deviation whose emulation gives it exactly, and the
verdict follows the registry's severities."""

from __future__ import annotations

import numpy as np
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
