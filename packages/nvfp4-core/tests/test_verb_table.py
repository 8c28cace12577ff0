"""The verb table (:data:`nvfp4.contract.VERBS`) is the one place a verb's facts live: the
kernel contract, the capability names and core's argument checks derive from it, and a new
verb is one table entry, its reference and its kernel (nvfp4-torch's test adds its
operator). The toy verb here, ``qmm_relu`` (``max(x @ decode(W).T, 0)``), is built end to
end that way."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np
import nvfp4
import pytest
from nvfp4 import Frontend, contract, quantize, reference, verbs
from nvfp4.contract import CAPABILITIES, KERNELS, OPTIONAL_CAPABILITIES, VERBS, Verb
from nvfp4.reference_backend import ReferenceKernels

RNG = np.random.default_rng(7)


def test_the_kernel_contract_and_capabilities_derive_from_the_table() -> None:
    assert {name: v.capability for name, v in VERBS.items()} == KERNELS
    assert all(v.name == name for name, v in VERBS.items())
    assert {v.capability for v in VERBS.values()} <= set(CAPABILITIES)
    assert set(CAPABILITIES) >= OPTIONAL_CAPABILITIES
    assert {v.kind for v in VERBS.values()} == {"matmul", "encode", "decode"}
    # every verb of the table is a method of the front end, checked as its kind is
    for name in VERBS:
        assert callable(getattr(Frontend(ReferenceKernels()), name))


def _relu_reference(x: Any, planes: Any) -> Any:
    """The toy verb's reference: the spec's qmm, then max(., 0)."""
    return np.maximum(reference.qmm(x, planes), 0)


class _ToyKernels(ReferenceKernels):
    """The reference's kernels plus the toy verb's kernel (and its capability declared)."""

    def __init__(self) -> None:
        super().__init__()
        caps = self.info.capabilities | {"qmm_relu"}
        self.info = dataclasses.replace(self.info, name="toy", capabilities=caps)

    def qmm_relu(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        return np.maximum(self.qmm(x, w, out_dtype=out_dtype), 0)


@pytest.fixture
def toy_verb(monkeypatch: pytest.MonkeyPatch) -> Verb:
    """The toy verb's one table entry (and its capability's line), for this test only."""
    verb = Verb("qmm_relu", "qmm_relu", "matmul", summary="max(x @ decode(W).T, 0)")
    monkeypatch.setitem(contract.VERBS, verb.name, verb)
    monkeypatch.setitem(contract.CAPABILITIES, "qmm_relu", "qmm then ReLU, exact vs reference")
    return verb


def test_a_new_verb_is_a_table_entry_a_reference_and_a_kernel(toy_verb: Verb) -> None:
    planes = quantize(RNG.standard_normal((24, 64)).astype(np.float32), name="toy.weight")
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)  # [..., K]: core reshapes
    toy = Frontend(_ToyKernels())
    assert toy.has("qmm_relu")
    y = toy.qmm_relu(x, toy.prepare(planes))
    want = _relu_reference(x.reshape(6, 64), planes).reshape(2, 3, 24)
    np.testing.assert_array_equal(y, want.astype(np.float32))
    assert (y >= 0).all()
    assert (y == 0).any()
    # the module-level verb runs on the backend the weight came from, the reference for planes
    np.testing.assert_array_equal(verbs.qmm_relu(x, toy.prepare(planes)), y)
    with pytest.raises(NotImplementedError, match="has no qmm_relu kernel"):
        verbs.qmm_relu(x, planes)
    # core's checks are the matmul kind's, with the verb's name in them
    with pytest.raises(ValueError, match="qmm_relu"):
        toy.qmm_relu(np.ones((2, 48), np.float32), planes)
    # a backend without the kernel refuses it by name
    ref = Frontend(ReferenceKernels())
    assert not ref.has("qmm_relu")
    with pytest.raises(NotImplementedError, match="has no qmm_relu kernel"):
        ref.qmm_relu(x, planes)


def test_a_verb_outside_the_table_is_not_a_verb() -> None:
    with pytest.raises(AttributeError):
        Frontend(ReferenceKernels()).qmm_relu
    with pytest.raises(AttributeError, match="qmm_relu"):
        verbs.qmm_relu


def test_the_module_level_matmul_verbs_take_the_front_ends_arguments() -> None:
    matmuls = [name for name, v in VERBS.items() if v.kind == "matmul"]
    assert set(matmuls) <= set(verbs.__all__)
    for name in matmuls:
        verb = getattr(verbs, name)
        assert verb.__name__ == name
        assert getattr(nvfp4, name) is verb
        own = list(inspect.signature(getattr(Frontend, name)).parameters.values())[1:]
        assert list(inspect.signature(verb).parameters.values()) == own
    assert list(inspect.signature(verbs.gather_qmm).parameters) == [
        "x",
        "w",
        "expert_ids",
        "sorted_indices",
        "out_dtype",
    ]


def test_the_front_ends_matmul_verbs_take_their_table_entrys_arguments() -> None:
    """Each matmul verb's arguments are those of its entry (experts: ``expert_ids`` and
    ``sorted_indices``; a static scale: ``input_scale``), with their defaults, and others are
    refused by name; ``verb(name)`` is the same function."""
    ref = Frontend(ReferenceKernels())
    params = {name: list(inspect.signature(getattr(ref, name)).parameters) for name in KERNELS}
    assert params["qmm"] == params["qmm_w4a8"] == ["x", "w", "out_dtype"]
    assert (
        params["gather_qmm"]
        == params["gather_qmm_w4a8"]
        == [
            "x",
            "w",
            "expert_ids",
            "sorted_indices",
            "out_dtype",
        ]
    )
    assert params["qmm_w4a4"] == params["qmm_w4a8_fp8"] == ["x", "w", "input_scale", "out_dtype"]
    planes = quantize(RNG.standard_normal((8, 64)).astype(np.float32), name="w")
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    with pytest.raises(TypeError, match=r"gather_qmm\(\) missing 1 required .*'expert_ids'"):
        ref.gather_qmm(x, planes)
    with pytest.raises(TypeError, match=r"qmm\(\) got an unexpected keyword argument 'sorted_"):
        ref.qmm(x, planes, sorted_indices=True)
    with pytest.raises(TypeError, match=r"qmm_w4a8\(\) takes 3 positional arguments but 4 "):
        ref.qmm_w4a8(x, planes, 1.0)
    # the table's function, defaults included, whichever way it is reached
    np.testing.assert_array_equal(ref.verb("qmm_w4a4")(x, planes), ref.qmm_w4a4(x, planes))
    np.testing.assert_array_equal(
        ref.qmm(x=x, w=planes, out_dtype="float16"), reference.qmm(x, planes, out_dtype="float16")
    )
