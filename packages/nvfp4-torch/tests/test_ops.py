"""torch.ops.nvfp4 and the NVFP4 torch modules: each op equals core's verb on the same
backend bit for bit, passes torch.library.opcheck (schema, fake tensor, AOT dispatch),
re-prepares a weight written in place, and a model of NVFP4 modules compiled with
``fullgraph=True`` equals its eager run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import nvfp4
import pytest
import torch
from nvfp4 import reference
from nvfp4_torch import ops as torch_ops
from nvfp4_torch.arrays import to_numpy
from nvfp4_torch.modules import NVFP4Experts, NVFP4Linear

REF = nvfp4.get_backend("reference")


@pytest.fixture(autouse=True)
def on_reference() -> Iterator[None]:
    """Every test here runs the ops on the reference backend (a backend of its own choosing
    is tested by its package)."""
    torch_ops.use_backend("cpu", "reference")
    torch_ops.clear_cache()
    yield
    torch_ops.use_backend("cpu", None)
    torch_ops.clear_cache()


def _planes(n: int, k: int, seed: int, experts: int | None = None) -> nvfp4.NVFP4Planes:
    rng = np.random.default_rng(seed)
    if experts is None:
        return reference.quantize(rng.standard_normal((n, k)).astype(np.float32), name="w")
    stack = [
        reference.quantize(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(experts)
    ]
    return nvfp4.NVFP4Planes(
        np.stack([p.codes for p in stack]),
        np.stack([p.scales for p in stack]),
        np.array([p.global_scale for p in stack], np.float32),
        name="experts",
    )


def _np(t: Any) -> np.ndarray:
    return np.asarray(t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy())


def _ref_out(y: Any, dtype: Any) -> np.ndarray:
    """A reference-backend result as float32 numpy (bfloat16 widened exactly)."""
    return np.asarray(y).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_qmm_equals_the_backend_verb(dtype: str) -> None:
    planes = _planes(40, 64, 1)
    x = torch.randn(2, 3, 64).to(getattr(torch, dtype))
    y = torch.ops.nvfp4.qmm(x, *torch_ops.plane_tensors(planes))
    assert y.dtype == x.dtype
    assert tuple(y.shape) == (2, 3, 40)
    want = REF.qmm(to_numpy(x), planes)
    np.testing.assert_array_equal(_np(y), _ref_out(want, dtype))


def test_fused_partitions_and_w4a16_modes_equal_the_verbs() -> None:
    a, b = _planes(16, 32, 2), _planes(24, 32, 3)
    fused = nvfp4.NVFP4Planes(
        np.concatenate([a.codes, b.codes]),
        np.concatenate([a.scales, b.scales]),
        np.array([a.global_scale, b.global_scale], np.float32),
        partitions=(0, 16, 40),
        name="qkv",
    )
    x = torch.randn(5, 32)
    lin = NVFP4Linear(fused)
    np.testing.assert_array_equal(lin(x).numpy(), REF.qmm(x.numpy(), fused))


def test_gather_qmm_and_out_of_range_ids() -> None:
    planes = _planes(24, 32, 4, experts=3)
    x = torch.randn(6, 32)
    ids = torch.tensor([2, 0, 7, 1, -1, 2])
    y = torch.ops.nvfp4.gather_qmm(x, *torch_ops.plane_tensors(planes), ids)
    want = REF.gather_qmm(x.numpy(), planes, ids.numpy())
    np.testing.assert_array_equal(y.numpy(), want)
    assert not y[2].any()
    assert not y[4].any()
    experts = NVFP4Experts(planes)
    np.testing.assert_array_equal(experts(x, ids).numpy(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantize_is_exact(dtype: Any) -> None:
    planes = _planes(16, 48, 5)
    d = torch.ops.nvfp4.dequantize(*torch_ops.plane_tensors(planes), dtype)
    assert d.dtype == dtype
    name = str(dtype).split(".")[-1]
    np.testing.assert_array_equal(
        _np(d), np.asarray(reference.dequantize(planes, name)).astype(np.float32)
    )


@pytest.mark.parametrize(
    ("mode", "input_scale"),
    [("w4a8", None), ("w4a8_fp8", None), ("w4a8_fp8", 0.05), ("w4a4", None), ("w4a4", 0.01)],
)
def test_activation_modes_equal_the_verbs(mode: str, input_scale: float | None) -> None:
    planes = _planes(32, 64, 6)
    x = torch.randn(4, 64)
    lin = NVFP4Linear(planes, activations=mode, input_scale=input_scale)
    verb = getattr(REF, f"qmm_{mode}")
    want = (
        verb(x.numpy(), planes)
        if mode == "w4a8"
        else verb(x.numpy(), planes, input_scale=input_scale)
    )
    np.testing.assert_array_equal(lin(x).numpy(), want)


def test_gather_w4a8_equals_the_verb() -> None:
    planes = _planes(16, 64, 7, experts=2)
    x, ids = torch.randn(3, 64), torch.tensor([1, 0, 5])
    want = REF.gather_qmm_w4a8(x.numpy(), planes, ids.numpy())
    np.testing.assert_array_equal(NVFP4Experts(planes, activations="w4a8")(x, ids).numpy(), want)


def _op_cases() -> list[tuple[str, tuple[Any, ...]]]:
    p, e = _planes(16, 64, 8), _planes(16, 64, 9, experts=2)
    w, we = torch_ops.plane_tensors(p), torch_ops.plane_tensors(e)
    x, ids = torch.randn(3, 64), torch.tensor([1, 0, 3])
    return [
        ("qmm", (x, *w)),
        ("gather_qmm", (x, *we, ids)),
        ("dequantize", (*w, torch.float16)),
        ("qmm_w4a4", (x, *w, 0.02)),
        ("qmm_w4a8", (x, *w)),
        ("gather_qmm_w4a8", (x, *we, torch.tensor([0, 1, 3]), True)),
        ("qmm_w4a8_fp8", (x, *w, None)),
    ]


@pytest.mark.parametrize(
    ("name", "args"), _op_cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_opcheck(name: str, args: tuple[Any, ...]) -> None:
    torch.library.opcheck(getattr(torch.ops.nvfp4, name).default, args)


def test_prepared_once_and_again_after_an_in_place_write() -> None:
    planes = _planes(16, 32, 10)
    codes, scales, g = torch_ops.plane_tensors(planes)
    x = torch.randn(2, 32)
    y1 = torch.ops.nvfp4.qmm(x, codes, scales, g)
    assert len(torch_ops._cache) == 1
    torch.ops.nvfp4.qmm(x, codes, scales, g)
    assert len(torch_ops._cache) == 1  # the same handle, not a second prepare
    codes[0, 0] ^= 0x88  # flips the signs of the first two weights of row 0, in place
    y2 = torch.ops.nvfp4.qmm(x, codes, scales, g)
    changed = nvfp4.NVFP4Planes(codes.numpy().copy(), planes.scales, planes.global_scale)
    np.testing.assert_array_equal(y2.numpy(), REF.qmm(x.numpy(), changed))
    assert not torch.equal(y1[:, 0], y2[:, 0])


def test_float8_scales_are_accepted_and_others_refused() -> None:
    planes = _planes(16, 32, 11)
    codes, scales, g = torch_ops.plane_tensors(planes)
    x = torch.randn(1, 32)
    y = torch.ops.nvfp4.qmm(x, codes, scales.view(torch.float8_e4m3fn), g)
    np.testing.assert_array_equal(y.numpy(), REF.qmm(x.numpy(), planes))
    with pytest.raises(
        TypeError, match=r"scales dtype expected uint8 or float8_e4m3fn, found torch\.float32"
    ):
        torch.ops.nvfp4.qmm(x, codes, scales.float(), g)


def test_bad_planes_are_refused_by_core_with_the_plane_named() -> None:
    planes = _planes(16, 32, 12)
    codes, scales, g = torch_ops.plane_tensors(planes)
    scales[3, 1] = 0x7F  # the E4M3 NaN byte: content validation refuses it
    with pytest.raises(nvfp4.PlaneError, match=r"torch\.ops\.nvfp4 weight"):
        torch.ops.nvfp4.qmm(torch.randn(1, 32), codes, scales, g)


def test_no_backend_for_a_device_type_says_so() -> None:
    with pytest.raises(
        RuntimeError, match=r"torch\.ops\.nvfp4 on meta tensors: no backend can run"
    ):
        torch_ops.backend_for(torch.device("meta"))


def test_modules_refuse_the_wrong_rank_and_modes() -> None:
    with pytest.raises(ValueError, match="use NVFP4Experts"):
        NVFP4Linear(_planes(16, 32, 13, experts=2))
    with pytest.raises(ValueError, match="expected an expert stack"):
        NVFP4Experts(_planes(16, 32, 13))
    with pytest.raises(ValueError, match="activations: expected one of"):
        NVFP4Linear(_planes(16, 32, 13), activations="w8a8")


class _Block(torch.nn.Module):  # type: ignore[misc]
    """A small MoE-style block: an NVFP4 linear, a nonlinearity, an expert stack, another
    linear with a bias and a W4A8 path."""

    def __init__(self) -> None:
        super().__init__()
        self.up = NVFP4Linear(_planes(64, 32, 20))
        self.experts = NVFP4Experts(_planes(32, 64, 21, experts=4))
        self.down = NVFP4Linear(_planes(32, 32, 22), torch.randn(32), activations="w4a8")

    def forward(self, x: Any, ids: Any) -> Any:
        h = torch.nn.functional.silu(self.up(x))
        return self.down(self.experts(h, ids))


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compiled_model_equals_eager(compiler: str) -> None:
    torch._dynamo.reset()
    model = _Block().eval()
    x, ids = torch.randn(5, 32), torch.tensor([0, 3, 1, 9, 2])
    eager = model(x, ids)
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    with torch.no_grad():
        got = compiled(x, ids)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["w4a16", "w4a8", "w4a8_fp8", "w4a4"])
def test_nvfp4_linear_compiles_without_a_graph_break(mode: str) -> None:
    """``torch.compile(fullgraph=True)`` of an NVFP4Linear (with a bias, in every activation
    mode) traces one graph with no break, and the compiled module's output is the eager
    one's, bit for bit, on the cpu device."""
    torch._dynamo.reset()
    linear = NVFP4Linear(_planes(48, 64, 23), torch.randn(48), activations=mode).eval()
    x = torch.randn(3, 64)
    explained = torch._dynamo.explain(linear)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    with torch.no_grad():
        got = torch.compile(linear, fullgraph=True, backend="inductor")(x)
    torch.testing.assert_close(got, linear(x), rtol=0, atol=0)


def test_a_bound_linear_computes_what_the_operators_compute() -> None:
    """The two ways an NVFP4Linear computes (through ``torch.ops.nvfp4`` and bound to one
    backend object) give the same bits, with and without a bias."""
    for bias in (None, torch.randn(40)):
        linear = NVFP4Linear(_planes(40, 64, 24), bias)
        x = torch.randn(2, 3, 64)
        through_ops = linear(x)
        linear.bind(nvfp4.get_backend("reference"))
        assert linear.bound is not None
        bound = linear(x)
        linear.bind(None)
        assert linear.bound is None
        torch.testing.assert_close(bound, through_ops, rtol=0, atol=0)
        assert bound.shape == (2, 3, 40)


def test_a_new_verb_of_the_table_gets_its_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verb added to :data:`nvfp4.contract.VERBS` (with its kernel in a backend) becomes
    ``torch.ops.nvfp4.<verb>`` through :func:`nvfp4_torch.ops.register`: its schema from
    the table entry's kind, its fake kernel from the same, so it compiles too."""
    import dataclasses

    from nvfp4 import contract
    from nvfp4.reference_backend import ReferenceKernels

    verb = contract.Verb("qmm_relu_t", "qmm_relu_t", "matmul", summary="max(qmm, 0)")
    monkeypatch.setitem(contract.VERBS, verb.name, verb)
    monkeypatch.setitem(contract.CAPABILITIES, verb.capability, "qmm then ReLU")

    class Toy(ReferenceKernels):
        def __init__(self) -> None:
            super().__init__()
            caps = self.info.capabilities | {verb.capability}
            self.info = dataclasses.replace(self.info, name="toy", capabilities=caps)

        def qmm_relu_t(self, x: Any, w: Any, *, out_dtype: str) -> Any:
            return np.maximum(self.qmm(x, w, out_dtype=out_dtype), 0)

    torch_ops.use_backend("cpu", nvfp4.Frontend(Toy()))
    op = torch_ops.register("qmm_relu_t")
    assert torch_ops.register("qmm_relu_t") is op  # once
    planes = _planes(24, 64, 31)
    x = torch.randn(5, 64)
    y = torch.ops.nvfp4.qmm_relu_t(x, *torch_ops.plane_tensors(planes))
    want = torch.relu(torch.ops.nvfp4.qmm(x, *torch_ops.plane_tensors(planes)))
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    compiled = torch.compile(
        lambda t: torch.ops.nvfp4.qmm_relu_t(t, *torch_ops.plane_tensors(planes)),
        fullgraph=True,
        backend="aot_eager",
    )
    torch.testing.assert_close(compiled(x), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not a matmul"):
        torch_ops.register("dequantize")
