"""The parallel layers built from shards a rank loaded alone
(:func:`nvfp4_checkpoints.load_rank`, ``planes_are_shard=True``) give exactly the outputs of
the same layers built from the whole planes, on real gloo groups of 2 and 3 ranks: a paired
gate/up -> down MLP with a padded last unit, a gathered column-parallel lm_head, and expert
parallelism from an expert shard cut beforehand; a shard
of the wrong size is refused naming the layer, the rank, the expected and the found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import nvfp4
import pytest
import torch
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import expert_plan
from nvfp4.shard_planes import shard_planes
from nvfp4_checkpoints import load_rank, open_checkpoint, write_checkpoint
from nvfp4_torch.parallel import ColumnParallelLinear, ExpertParallelExperts, RowParallelLinear
from nvfp4_torch.ranks import run_worlds

HIDDEN, INTER, VOCAB = 64, 176, 48  # 176 = 11 blocks: align 2 leaves a padded last unit
MLP = "model.layers.0.mlp."
GATE, UP, DOWN, HEAD = MLP + "gate_proj", MLP + "up_proj", MLP + "down_proj", "lm_head"
ALIGN = 2


def x_of(seed: int, m: int, k: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32))


def layers_out(planes: dict[str, NVFP4Planes], plans: Any, g: Any, is_shard: bool) -> Any:
    """The MLP's and lm_head's outputs of this rank, from ``planes`` (shards or whole)."""
    be = nvfp4.get_backend("cpu")
    rank = torch.distributed.get_rank(g)

    def layer(cls: Any, name: str, **kwargs: Any) -> Any:
        """Layer ``name`` of class ``cls`` on this rank, from ``planes[name]`` and its plan."""
        return cls(
            planes[name], plans[name], group=g, backend=be, planes_are_shard=is_shard, **kwargs
        )

    gate = layer(ColumnParallelLinear, GATE, gather_output=False)
    up = layer(ColumnParallelLinear, UP, gather_output=False)
    down = layer(RowParallelLinear, DOWN, input_is_parallel=True)
    x = x_of(1, 4, HIDDEN)
    local = gate(x)
    assert local.shape[-1] == plans[DOWN][rank].padded
    mlp = down(torch.nn.functional.silu(local) * up(x))
    return {"mlp": mlp, "head": layer(ColumnParallelLinear, HEAD, gather_output=True)(x)}


def _rank_main(ops: Any, folder: str, src: str) -> None:
    shard = load_rank(src, ops.rank, ops.world, align=ALIGN)
    with open_checkpoint(src) as ck:
        whole = {name: ck.planes(name) for name in ck.quantized_names()}
    out = {
        "shard": layers_out(dict(shard.planes), shard.plans, ops.group, True),
        "whole": layers_out(whole, shard.plans, ops.group, False),
    }
    # expert parallelism from a shard cut beforehand (as a loader of EP ranks would)
    experts = nvfp4.quantize(
        np.random.default_rng(9).standard_normal((5, 16, 64), dtype=np.float32), name="experts"
    )
    plan = expert_plan(5, ops.world)
    ids = torch.tensor([0, 4, -1, 2, 1, 3])
    xe = x_of(10, 6, 64)
    be = nvfp4.get_backend("cpu")
    out["experts"] = {
        "shard": ExpertParallelExperts(
            shard_planes(experts, plan, ops.rank),
            plan,
            group=ops.group,
            backend=be,
            planes_are_shard=True,
        )(xe, ids),
        "whole": ExpertParallelExperts(experts, plan, group=ops.group, backend=be)(xe, ids),
    }
    try:
        RowParallelLinear(whole[DOWN], shard.plans[DOWN], group=ops.group, planes_are_shard=True)
        out["refusal"] = "none"
    except ValueError as e:
        out["refusal"] = str(e)
    torch.save(out, Path(folder) / f"world{ops.world}_rank{ops.rank}.pt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shard_ranks")
    rng = np.random.default_rng(7)
    shapes = {
        GATE: (INTER, HIDDEN),
        UP: (INTER, HIDDEN),
        DOWN: (HIDDEN, INTER),
        HEAD: (VOCAB, HIDDEN),
    }
    planes = {
        n: nvfp4.quantize(rng.standard_normal(s, dtype=np.float32), name=n)
        for n, s in shapes.items()
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
    }
    src = write_checkpoint(folder / "model", planes, flavour="modelopt", config=config)
    run_worlds(_rank_main, (2, 3), (str(folder), str(src)))
    return folder


@pytest.mark.parametrize("world", [2, 3])
def test_layers_from_loaded_shards_equal_layers_from_whole_planes(
    spawned: Path, world: int
) -> None:
    for rank in range(world):
        out = torch.load(spawned / f"world{world}_rank{rank}.pt")
        for key in ("mlp", "head"):
            got, want = out["shard"][key], out["whole"][key]
            assert got.shape == want.shape, (key, rank)
            assert torch.equal(got, want), (key, rank)
            assert torch.count_nonzero(got) > 0
        assert out["whole"]["head"].shape == (4, VOCAB)
        got, want = out["experts"]["shard"], out["experts"]["whole"]
        assert torch.equal(got, want), rank
        assert torch.equal(got[2], torch.zeros(16))  # id -1: no rank's expert
        assert torch.count_nonzero(got[0]) > 0


@pytest.mark.parametrize("world", [2, 3])
def test_a_shard_of_the_wrong_size_is_refused(spawned: Path, world: int) -> None:
    msg = torch.load(spawned / f"world{world}_rank0.pt")["refusal"]
    assert "RowParallelLinear('model.layers.0.mlp.down_proj') rank 0" in msg
    assert f"found {INTER}" in msg  # the whole K, not the rank's
    assert "expected the plan's k size" in msg
