"""``load_rank``: one tensor-parallel rank's shards read from a checkpoint (spec 1.2,
"Sharding"). Every rank's planes equal ``shard_planes(whole, plan_for(...), rank)`` byte for
byte, for every tensor, world sizes 1, 2, 3, 4 and 8, in each safetensors flavour, on a
2,880 hidden size with Nemotron-3-Nano's 1,856 intermediate (uneven K at 8) and 45 heads of
64 (KV heads split, then replicated at 8); with alignment padding; for a fused MLX tensor;
the same from ``nvfp4 shard``'s output; only the rank's bytes are read (another rank's
poisoned scales do not stop it); bad input refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4.fused_plan import FusedPlan
from nvfp4.fusion import fuse
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_planes import shard_fused, shard_planes
from nvfp4_checkpoints import (
    CheckpointError,
    RankShard,
    load_rank,
    open_checkpoint,
    write_checkpoint,
)
from nvfp4_checkpoints.safetensors_io import read_header
from nvfp4_checkpoints.shard import MANIFEST, plan_for, shard_checkpoint
from nvfp4_checkpoints.shard_layout import recorded_partitions
from small_models import llama_config

FLAVOURS = ("modelopt", "compressed-tensors", "mlx")
HIDDEN, INTER, VOCAB = 2880, 1856, 100
LAYER = "model.layers.0."
DOWN = LAYER + "mlp.down_proj"


def _config() -> dict[str, Any]:
    return llama_config(
        hidden=HIDDEN,
        intermediate=INTER,
        vocab=VOCAB,
        kv_heads=5,
        num_attention_heads=45,
        head_dim=64,
    )


@pytest.fixture(scope="module")
def model() -> tuple[dict[str, NVFP4Planes], dict[str, np.ndarray]]:
    """One Llama layer, its lm_head and embedding: every plan kind of ``plan_for``."""
    rng = np.random.default_rng(2880)
    shapes = {
        LAYER + "self_attn.q_proj": (45 * 64, HIDDEN),
        LAYER + "self_attn.k_proj": (5 * 64, HIDDEN),
        LAYER + "self_attn.v_proj": (5 * 64, HIDDEN),
        LAYER + "self_attn.o_proj": (HIDDEN, 45 * 64),
        LAYER + "mlp.gate_proj": (INTER, HIDDEN),
        LAYER + "mlp.up_proj": (INTER, HIDDEN),
        DOWN: (HIDDEN, INTER),
        "lm_head": (VOCAB, HIDDEN),
    }
    planes = {
        name: quantize(rng.standard_normal(shape, dtype=np.float32), name=name)
        for name, shape in shapes.items()
    }
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16),
        LAYER + "input_layernorm.weight": np.ones(HIDDEN, ml_dtypes.bfloat16),
    }
    return planes, tensors


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, model: Any) -> dict[str, Path]:
    planes, tensors = model
    root = tmp_path_factory.mktemp("rank_loading")
    scales = {DOWN: 0.25, LAYER + "self_attn.q_proj": 0.5}
    return {
        f: write_checkpoint(
            root / f, planes, flavour=f, tensors=tensors, config=_config(), input_scales=scales
        )
        for f in FLAVOURS
    }


def assert_same_planes(got: NVFP4Planes, want: NVFP4Planes, what: str) -> None:
    for part in ("codes", "scales", "global_scale"):
        a, b = getattr(got, part), getattr(want, part)
        assert a.dtype == b.dtype, (what, part)
        assert a.shape == b.shape, (what, part, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), (what, part)
    assert got.partitions == want.partitions, what


def assert_rank_is_the_shard(shard: RankShard, src: Path, align: int = 1) -> None:
    with open_checkpoint(src) as ck:
        assert sorted(shard.planes) == sorted(ck.quantized_names())
        for name in ck.quantized_names():
            n, k = ck.plane_shape(name).shape[-2:]
            bounds = recorded_partitions(ck, name)
            plan = plan_for(name, n, k, shard.world, align, ck.config, bounds)
            assert shard.plans[name] == plan
            if isinstance(plan, FusedPlan):
                want = shard_fused(ck.planes(name), plan, shard.rank)
            else:
                want = shard_planes(ck.planes(name), plan, shard.rank)
            assert_same_planes(shard.planes[name], want, f"{name} rank {shard.rank}")
            assert shard.input_scales.get(name) == ck.input_scale(name)
        assert sorted(shard.tensors) == sorted(ck.tensor_names())
        for name, t in shard.tensors.items():
            whole = ck.tensor(name)
            assert t.dtype == whole.dtype
            assert t.shape == whole.shape
            assert t.tobytes() == whole.tobytes()
            assert not isinstance(t, np.memmap)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_every_rank_is_its_shard_byte_for_byte(
    checkpoints: dict[str, Path], flavour: str, world: int
) -> None:
    src = checkpoints[flavour]
    read = []
    for rank in range(world):
        shard = load_rank(src, rank, world)
        assert (shard.rank, shard.world, shard.flavour, shard.align) == (rank, world, flavour, 1)
        assert_rank_is_the_shard(shard, src)
        read.append(shard.bytes_read - sum(t.nbytes for t in shard.tensors.values()))
    if world == 8:  # 1,856 = 116 blocks: ranks 0-3 hold 15, ranks 4-7 hold 14
        sizes = [load_rank(src, r, 8).plans[DOWN][r].size for r in (0, 7)]
        assert sizes == [240, 224]
    with open_checkpoint(src) as ck:
        nvfp4_bytes = sum(ck.plane_shape(n).nbytes for n in ck.quantized_names())
    if world <= 5:  # no KV head replicated: the ranks read the NVFP4 bytes once between them
        globals_read = sum(read) - nvfp4_bytes
        assert 0 < globals_read <= 8 * 8 * world  # (8 tensors' globals, at most 8 bytes each)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_alignment_padding_is_zero_and_equal_to_shard_planes(
    checkpoints: dict[str, Path], flavour: str
) -> None:
    src = checkpoints[flavour]
    last = load_rank(src, 7, 8, align=8)  # 14.5 units of 128: rank 7 holds 64 values + 64 zero
    assert last.plans[DOWN][7].start == 1792
    assert last.plans[DOWN][7].padded == 128
    down = last.planes[DOWN]
    assert down.k == 128
    assert not down.codes[:, 32:].any()
    assert not down.scales[:, 4:].any()
    up = last.planes[LAYER + "mlp.up_proj"]  # the paired rule: padded rows
    assert up.n == 128
    assert not up.codes[64:].any()
    for rank in (0, 7):
        assert_rank_is_the_shard(load_rank(src, rank, 8, align=8), src, align=8)


def test_a_fused_mlx_tensor_is_read_per_partition(tmp_path: Path) -> None:
    """q/k/v fused (4 heads, 2 KV heads of 16): every rank reads its rows of each partition
    (the KV heads split at 2 ranks, replicated at 3 and 4) and keeps every partition's
    global; its bounds are its own pieces'."""
    rng = np.random.default_rng(3)
    parts = [quantize(rng.standard_normal((r, 64), dtype=np.float32)) for r in (64, 32, 32)]
    name = LAYER + "self_attn.qkv_proj"
    src = write_checkpoint(
        tmp_path / "fused",
        {name: fuse(parts, name)},
        flavour="mlx",
        config=llama_config(),
    )
    kv_rows = {2: [16, 16], 3: [16, 16, 16], 4: [16, 16, 16, 16]}
    for world in (2, 3, 4):
        for rank in range(world):
            shard = load_rank(src, rank, world)
            plan = shard.plans[name]
            assert isinstance(plan, FusedPlan)
            q = plan[0][rank].size
            assert shard.planes[name].partitions == (0, q, q + kv_rows[world][rank], q + 32)
            assert shard.planes[name].global_scale.shape == (3,)
            assert_rank_is_the_shard(shard, src)


def test_stacked_mlx_experts_are_cut_expert_by_expert(tmp_path: Path) -> None:
    """MLX's stacked ``switch_mlp`` experts ``[E, N, K]``, one global per expert: every
    expert's rows (gate, by down's K plan) or K columns (down) of the rank."""
    rng = np.random.default_rng(4)
    head = "model.layers.0.mlp.switch_mlp."
    planes = {
        head + "gate_proj": quantize(rng.standard_normal((4, 96, 64), dtype=np.float32)),
        head + "down_proj": quantize(rng.standard_normal((4, 64, 96), dtype=np.float32)),
    }
    planes = {name: p.replace(name=name) for name, p in planes.items()}
    src = write_checkpoint(tmp_path / "moe", planes, flavour="mlx", config=llama_config())
    for world in (2, 3, 4):
        for rank in range(world):
            shard = load_rank(src, rank, world)
            assert shard.plans[head + "down_proj"].dim == "k"
            assert shard.planes[head + "down_proj"].num_experts == 4
            assert shard.planes[head + "gate_proj"].global_scale.shape == (4,)
            assert_rank_is_the_shard(shard, src)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_sharded_folder_loads_its_rank_folder_alone(
    tmp_path: Path, checkpoints: dict[str, Path], flavour: str
) -> None:
    src = checkpoints[flavour]
    dst = shard_checkpoint(src, tmp_path / "dst", tp=3)
    for rank in range(3):
        got = load_rank(dst, rank, 3)
        want = load_rank(src, rank, 3)
        assert got.path == dst / f"rank-{rank}"
        assert got.plans == want.plans
        assert got.input_scales == want.input_scales
        for name, planes in want.planes.items():
            if flavour == "compressed-tensors":  # the written global: a float32 reciprocal
                planes = planes.replace(global_scale=got.planes[name].global_scale)
            assert_same_planes(got.planes[name], planes, name)
        assert {n: t.tobytes() for n, t in got.tensors.items()} == {
            n: t.tobytes() for n, t in want.tensors.items()
        }
    # the rank folder alone: another rank's folder gone does not matter
    shutil.rmtree(dst / "rank-2")
    assert load_rank(dst, 0, 3).rank == 0


def _one_line(e: pytest.ExceptionInfo[Exception], *words: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_a_sharded_folder_that_disagrees_is_refused(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    dst = shard_checkpoint(checkpoints["modelopt"], tmp_path / "dst", tp=2)
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 4)
    _one_line(e, MANIFEST, "tp x ep", "expected 4", "found 2 x 1 = 2")
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 2, align=4)
    _one_line(e, "align_blocks", "expected 4", "found 1")
    manifest = json.loads((dst / MANIFEST).read_text())
    good = json.dumps(manifest)
    # a range moved by one block: not the plan
    ranks = manifest["tensors"][DOWN]["ranks"]
    ranks[0][1] += 16
    ranks[1][0] += 16
    (dst / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 2)
    _one_line(e, MANIFEST, DOWN, "expected the plan")
    # a padded size the rank folder's files do not have
    ranks[1][2] = 912
    (dst / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 1, 2)
    _one_line(e, "rank-1", DOWN, "expected K = 912", "found 928")
    # a tensor the files do not hold
    manifest = json.loads(good)
    manifest["tensors"]["model.layers.9.mlp.down_proj"] = manifest["tensors"][DOWN]
    (dst / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 2)
    _one_line(e, MANIFEST, "model.layers.9.mlp.down_proj", "expected rank-0's 8 NVFP4 tensors")
    # an expert-parallel manifest (tp 2 x ep 2)
    manifest = json.loads(good)
    manifest.update(ep=2, world=4)
    (dst / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 4)
    _one_line(e, MANIFEST, "ep: expected 1", "found 2")
    (dst / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 2)
    _one_line(e, MANIFEST, "JSON")
    (dst / MANIFEST).write_text(good)
    shutil.rmtree(dst / "rank-1")
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 1, 2)
    _one_line(e, "rank-1", "missing", "2 ranks")


def test_only_the_ranks_bytes_are_read(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    src = Path(shutil.copytree(checkpoints["modelopt"], tmp_path / "poisoned"))
    plan = load_rank(src, 0, 2).plans[DOWN]
    info = read_header(src / "model.safetensors")[0][DOWN + ".weight_scale"]
    kb = INTER // 16
    a, b = plan[1].start // 16, plan[1].stop // 16
    with open(src / "model.safetensors", "r+b") as f:  # rank 1's scales: E4M3 NaN (0x7F)
        for row in range(HIDDEN):
            f.seek(info.start + row * kb + a)
            f.write(b"\x7f" * (b - a))
    shard = load_rank(src, 0, 2)  # rank 0 never reads them
    assert shard.planes[DOWN].k == plan[0].padded
    assert not np.any(shard.planes[DOWN].scales == 0x7F)
    with pytest.raises(CheckpointError) as e:
        load_rank(src, 1, 2)
    _one_line(e, src.name, DOWN, "0x7F")


def test_bad_input_is_refused_in_one_line(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    src = checkpoints["modelopt"]
    for rank, world, words in (
        (2, 2, ("rank", "[0, 2)", "found 2")),
        (-1, 2, ("rank", "found -1")),
        (0, 0, ("world size", "found 0")),
        (0, True, ("world size", "found True")),
    ):
        with pytest.raises(CheckpointError) as e:
            load_rank(src, rank, world)
        _one_line(e, *words)
    with pytest.raises(CheckpointError) as e:
        load_rank(src, 0, 2, align=0)
    _one_line(e, "align", "found 0")
    with pytest.raises(CheckpointError) as e:  # 5 KV heads of 64, 45 heads: not 64 ranks
        load_rank(src, 0, 64)
    _one_line(e, src.name, "64 ranks")
    gguf = tmp_path / "w.gguf"
    small = write_checkpoint(
        tmp_path / "small",
        {DOWN: quantize(np.ones((64, 128), np.float32), name=DOWN)},
        flavour="modelopt",
        config=llama_config(hidden=64, intermediate=128),
    )
    with open_checkpoint(small) as ck:
        write_checkpoint(gguf, ck, flavour="gguf")
    with pytest.raises(CheckpointError) as e:
        load_rank(gguf, 0, 2)
    _one_line(e, str(gguf), "gguf", "expected a safetensors flavour")
    sharded = shard_checkpoint(gguf, tmp_path / "gguf-tp2", tp=2)
    with pytest.raises(CheckpointError) as e:
        load_rank(sharded, 0, 2)
    _one_line(e, MANIFEST, "flavour", "found 'gguf'")


@pytest.mark.parametrize("window", [100, 8 << 20])
def test_safetensors_ranges_are_the_slices_of_the_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """``SafetensorsFile.read``: every axis and range of a 3-D tensor, a strided range also
    through windows of two rows (not page-aligned: 48-byte rows)."""
    from nvfp4_checkpoints import safetensors_io
    from nvfp4_checkpoints.safetensors_io import SafetensorsFile, save_file

    a = np.arange(3 * 700 * 24, dtype=np.uint16).reshape(3, 700, 24)
    save_file(tmp_path / "t.safetensors", {"a": a, "s": np.array(2.5, np.float32)})
    monkeypatch.setattr(safetensors_io, "_STRIDED_CHUNK", window)
    with SafetensorsFile(tmp_path / "t.safetensors") as f:
        assert f.read("s").shape == ()
        assert f.read("s") == np.float32(2.5)
        assert np.array_equal(f.read("a"), a)
        for axis, start, stop in ((0, 1, 3), (1, 0, 700), (1, 5, 690), (-1, 8, 20), (2, 0, 0)):
            got = f.read("a", axis=axis, start=start, stop=stop)
            want = np.take(a, range(start, stop), axis=axis)
            assert got.shape == want.shape
            assert np.array_equal(got, want), (axis, start, stop)
            assert got.flags.writeable
            assert not isinstance(got, np.memmap)
        with pytest.raises(ValueError, match="outside axis 1"):
            f.read("a", axis=1, start=5, stop=701)
