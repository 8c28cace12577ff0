"""NVFP4Linear and NVFP4SwitchLinear as engines use them: drop-ins for nn.Linear and for
mlx-lm's SwitchLinear inside SwitchGLU (unsorted and sorted dispatch), against dense
modules holding the exactly decoded weights."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from metal_helpers import check_close, realistic_planes, to_np
from mlx.utils import tree_flatten
from nvfp4 import reference
from nvfp4.testing import relative_error
from nvfp4_metal.nn import NVFP4Linear, NVFP4SwitchLinear

switch_layers = pytest.importorskip("mlx_lm.models.switch_layers")


def test_linear_matches_dense_and_keeps_its_arrays_as_frozen_parameters() -> None:
    rng = np.random.default_rng(0)
    p = realistic_planes(rng, 40, 96, partitions=(0, 24, 32, 40), name="qkv")
    bias = mx.array(rng.standard_normal(40).astype(np.float32))
    layer = NVFP4Linear.from_planes(p, bias)
    names = dict(tree_flatten(layer.parameters()))
    assert set(names) == {"weight", "scales", "global_scale", "bias"}
    assert names["weight"].dtype == mx.uint32
    assert names["scales"].dtype == mx.uint8
    assert tree_flatten(layer.trainable_parameters()) == []
    x = rng.standard_normal((2, 5, 96)).astype(np.float32)
    y = to_np(layer(mx.array(x)))
    ref = reference.qmm(x.reshape(10, 96), p, out_dtype=None).reshape(2, 5, 40) + np.array(bias)
    assert y.shape == (2, 5, 40)
    check_close(y, ref, "qmm", "float32", "NVFP4Linear")
    assert layer.input_dims == 96
    assert layer.output_dims == 40
    assert "qkv" in repr(layer)


def test_linear_output_dtype_follows_x() -> None:
    rng = np.random.default_rng(1)
    layer = NVFP4Linear.from_planes(realistic_planes(rng, 8, 32))
    for dt in (mx.float16, mx.bfloat16, mx.float32):
        assert layer(mx.ones((3, 32), dtype=dt)).dtype == dt


def test_constructor_refuses_wrong_rank() -> None:
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="SwitchLinear"):
        NVFP4Linear.from_planes(realistic_planes(rng, 8, 32, experts=2))
    with pytest.raises(ValueError, match="NVFP4Linear"):
        NVFP4SwitchLinear.from_planes(realistic_planes(rng, 8, 32))


def _switch_glu(rng: np.random.Generator, e: int, d: int, h: int) -> tuple[object, object, dict]:
    """An mlx-lm SwitchGLU with NVFP4 projections and its dense twin."""
    planes = {
        "gate_proj": realistic_planes(rng, h, d, experts=e, name="gate"),
        "up_proj": realistic_planes(rng, h, d, experts=e, name="up"),
        "down_proj": realistic_planes(rng, d, h, experts=e, name="down"),
    }
    q = switch_layers.SwitchGLU(d, h, e)
    dense = switch_layers.SwitchGLU(d, h, e)
    for proj, p in planes.items():
        setattr(q, proj, NVFP4SwitchLinear.from_planes(p))
        getattr(dense, proj).weight = mx.array(reference.dequantize(p))
    return q, dense, planes


@pytest.mark.parametrize("tokens", [3, 40], ids=["unsorted_dispatch", "sorted_dispatch"])
def test_switch_glu_call_signature(tokens: int) -> None:
    """SwitchGLU sorts the tokens by expert when indices.size >= 64 (sorted_indices=True)."""
    rng = np.random.default_rng(tokens)
    e, d, h, k = 4, 64, 32, 2
    q, dense, _ = _switch_glu(rng, e, d, h)
    x = mx.array(rng.standard_normal((1, tokens, d)).astype(np.float32))
    idx = mx.array(np.stack([rng.choice(e, size=k, replace=False) for _ in range(tokens)])[None])
    assert (idx.size >= 64) == (tokens == 40)
    y, ref = to_np(q(x, idx)), to_np(dense(x, idx))
    assert y.shape == (1, tokens, k, d)
    # two NVFP4 matmuls in sequence vs the same decoded weights in float32
    assert relative_error(to_np(y), ref) < 1e-4


def test_switch_linear_bias_and_out_of_range() -> None:
    rng = np.random.default_rng(5)
    p = realistic_planes(rng, 12, 32, experts=3, name="experts")
    bias = mx.array(rng.standard_normal((3, 12)).astype(np.float32))
    layer = NVFP4SwitchLinear.from_planes(p, bias)
    x = rng.standard_normal((6, 32)).astype(np.float32)
    ids = np.array([0, 2, 1, 1, 0, 2])
    y = to_np(layer(mx.array(x)[:, None, :], mx.array(ids)))[:, 0, :]
    ref = reference.gather_qmm(x, p, ids, out_dtype=None) + np.array(bias)[ids]
    check_close(y, ref, "gather_qmm", "float32", "switch with bias")
    assert layer.num_experts == 3


def test_affine_rollback_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_METAL_IMPL", "affine")
    rng = np.random.default_rng(6)
    p = realistic_planes(rng, 64, 128)
    layer = NVFP4Linear.from_planes(p)
    assert layer.info.impl == "affine"
    assert set(dict(tree_flatten(layer.parameters()))) == {"weight", "scales", "biases"}
    x = rng.standard_normal((4, 128)).astype(np.float32)
    y = to_np(layer(mx.array(x)))
    # the module computes exactly what its own (affine) bytes decode to ...
    from nvfp4_metal import ops
    from nvfp4_metal.transcode import prepare

    own = to_np(ops.dequantize(prepare(p, impl="affine"), "float32")).astype(np.float64)
    assert relative_error(to_np(y), x.astype(np.float64) @ own.T) < 1e-5
    # ... which is a lossy 4-bit re-quantization of the NVFP4 weight, not its decode
    err = relative_error(to_np(y), reference.qmm(x, p, out_dtype=None))
    assert 1e-3 < err < 0.3, err
    assert isinstance(layer, nn.Module)
