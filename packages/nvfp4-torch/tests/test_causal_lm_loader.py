"""nvfp4_torch.loader on a real ModelOpt export: the swapped model's logits equal
those of the same model with the exactly decoded weights in plain linears (up to the float
summation order), and its torch.compile(fullgraph=True) forward equals the eager one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4_checkpoints import open_checkpoint
from nvfp4_torch import ops as torch_ops
from nvfp4_torch.loader import load_causal_lm, swap_linears
from nvfp4_torch.modules import NVFP4Linear


@pytest.fixture(autouse=True)
def on_reference() -> Iterator[None]:
    torch_ops.use_backend("cpu", "reference")
    yield
    torch_ops.use_backend("cpu", None)
    torch_ops.clear_cache()


def _dense_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The same model with every NVFP4Linear replaced by a float64-free plain Linear holding
    the exactly decoded weight (what W4A16 computes, up to summation order)."""
    import copy

    import nvfp4

    twin = copy.deepcopy(model)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, NVFP4Linear):
            planes = nvfp4.NVFP4Planes(
                mod.codes.numpy(), mod.scales.numpy(), mod.global_scale.numpy()
            )
            lin = torch.nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            lin.weight.data = torch.from_numpy(reference.dequantize(planes, "float32"))
            if mod.bias is not None:
                lin.bias.data = mod.bias.data.clone()
            twin.set_submodule(name, lin)
    return twin


def test_load_causal_lm_swaps_every_quantized_linear(modelopt_exports: dict[str, Path]) -> None:
    path = modelopt_exports["llama"]
    model = load_causal_lm(path)
    with open_checkpoint(path) as ckpt:
        quantized = list(ckpt.quantized_names())
    swapped = [n for n, m in model.named_modules() if isinstance(m, NVFP4Linear)]
    assert quantized
    assert sorted(swapped) == sorted(quantized)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        got = model(input_ids=ids).logits
        want = _dense_twin(model)(input_ids=ids).logits
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-5, err


def test_compiled_forward_equals_eager(modelopt_exports: dict[str, Path]) -> None:
    torch._dynamo.reset()
    model = load_causal_lm(modelopt_exports["llama"])
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        got = compiled(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, eager, rtol=0, atol=0)


def test_a_quantized_prefix_that_is_not_a_linear_is_refused(
    modelopt_exports: dict[str, Path],
) -> None:
    with open_checkpoint(modelopt_exports["llama"]) as ckpt:
        prefix = next(iter(ckpt.quantized_names()))
        model = torch.nn.Module()
        with pytest.raises(
            ValueError, match=f"tensor '{prefix}' is NVFP4, expected a torch.nn.Linear"
        ):
            swap_linears(model, ckpt)


def test_w4a8_model_is_close_to_w4a16(modelopt_exports: dict[str, Path]) -> None:
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        w4a16 = load_causal_lm(modelopt_exports["llama"])(input_ids=ids).logits
        w4a8 = load_causal_lm(modelopt_exports["llama"], activations="w4a8")(input_ids=ids).logits
    rel = float((w4a8 - w4a16).abs().max() / w4a16.abs().max())
    assert 0 < rel < 0.1, rel  # int8 activations: close, but not the same numbers
    assert np.isfinite(w4a8.numpy()).all()
