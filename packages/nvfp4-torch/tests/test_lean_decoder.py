"""The lean batch-1 decoder ``generate`` runs is held to the transformers forward T6
certifies: the same greedy tokens and the same logits, bit for bit, on every Llama-family
architecture it claims, fused or not, in every activation mode (on the reference backend:
the products are the backend's in both forwards; this package's tests install no other)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nvfp4_torch.testing import KINDS, tiny_model

pytest.importorskip("torch")
pytest.importorskip("transformers")


PROMPT = [1, 5, 9, 2, 17, 4]


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from nvfp4_torch import smollm2

    root = tmp_path_factory.mktemp("lean")
    return {
        kind: smollm2.write_nvfp4_checkpoint(
            smollm2.quantize_model(tiny_model(kind, seed=11)), root / kind
        )
        for kind in KINDS
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fuse", [False, True])
def test_lean_decoding_is_the_transformers_forward_bit_for_bit(
    tiny_checkpoints: dict[str, Path], kind: str, fuse: bool
) -> None:
    import nvfp4
    from nvfp4_torch import decode, loader
    from nvfp4_torch.lean_decoder import LeanDecoder, unsupported

    loaded = loader.load_model(tiny_checkpoints[kind], nvfp4.get_backend("reference"), fuse=fuse)
    if kind == "qwen2":  # the biases ride on the NVFP4 linears
        assert loaded.model.model.layers[0].self_attn.q_proj.bias is not None
    assert unsupported(loaded.model) is None
    lean = LeanDecoder(loaded.model, len(PROMPT) + 12)
    for mode in ("w4a16", "w4a8"):
        with decode.activation_mode(loaded.model, mode):
            want = decode.greedy(loaded.model, PROMPT, 12)
            got = decode.greedy(loaded.model, PROMPT, 12, lean=lean)
        assert got.new_ids == want.new_ids, mode
        np.testing.assert_array_equal(got.logits, want.logits, err_msg=mode)
        # every step attends over a longer cache: its logits move
        assert np.abs(np.diff(want.logits, axis=0)).max(axis=1).min() > 1e-3, mode


@pytest.mark.parametrize("fuse", [False, True])
def test_lean_decoding_with_unquantized_linears(
    tiny_checkpoints: dict[str, Path], fuse: bool
) -> None:
    """A mixed model (some linears left in float, as mixed-precision checkpoints have them)
    decodes the same on both forwards: plain ``torch.nn.Linear`` modules are called as
    they are, fused siblings of a float linear included."""
    import nvfp4
    import torch
    from nvfp4_torch import decode, loader
    from nvfp4_torch.lean_decoder import LeanDecoder

    loaded = loader.load_model(tiny_checkpoints["llama"], nvfp4.get_backend("reference"), fuse=fuse)
    torch.manual_seed(5)
    layer = loaded.model.model.layers[1]
    for owner, name in ((layer.mlp, "down_proj"), (layer.self_attn, "k_proj")):
        old = getattr(owner, name)
        plain = torch.nn.Linear(old.in_features, old.out_features, bias=False)
        torch.nn.init.normal_(plain.weight, 0.0, 0.2)
        setattr(owner, name, plain)
    lean = LeanDecoder(loaded.model, len(PROMPT) + 8)
    want = decode.greedy(loaded.model, PROMPT, 8)
    got = decode.greedy(loaded.model, PROMPT, 8, lean=lean)
    assert got.new_ids == want.new_ids
    np.testing.assert_array_equal(got.logits, want.logits)


def test_lean_decoder_refuses_what_it_does_not_cover(tiny_checkpoints: dict[str, Path]) -> None:
    import nvfp4
    from nvfp4_torch import decode, loader
    from nvfp4_torch.lean_decoder import LeanDecoder, unsupported

    loaded = loader.load_model(tiny_checkpoints["llama"], nvfp4.get_backend("reference"))
    model = loaded.model
    model.config.hidden_act = "gelu"
    assert unsupported(model) == "hidden_act 'gelu' (covered: 'silu')"
    with pytest.raises(ValueError, match="unsupported model: hidden_act 'gelu'"):
        LeanDecoder(model, 8)
    model.config.hidden_act = "silu"
    model.config.model_type = "gemma"
    assert unsupported(model) == "model type 'gemma' (covered: llama, mistral, qwen2)"
    model.config.model_type = "llama"
    model.model.rotary_emb.rope_type = "llama3"
    assert unsupported(model) == "rope type 'llama3' (covered: 'default')"
    model.model.rotary_emb.rope_type = "default"

    lean = LeanDecoder(model, 8)
    with pytest.raises(ValueError, match="exceed the lean decoder's cache of 8 positions"):
        decode.greedy(model, PROMPT, 3, lean=lean)
    lean.forward(PROMPT)
    with pytest.raises(ValueError, match="several tokens only for the prompt"):
        lean.forward([1, 2])
    with pytest.raises(ValueError, match="9 positions exceed the cache's 8"):
        lean.forward([1]), lean.forward([1]), lean.forward([1])
