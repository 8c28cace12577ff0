"""Fused tensors in checkpoints, sharded per partition (spec 1.2, "Sharding", fused
partitions): a SmolLM2-like layer (9 heads, 3 KV heads of 64) with q/k/v fused as
``qkv_proj`` and gate/up fused as ``gate_up_proj`` over Nemotron-3-Nano's 1,856
intermediate, in ModelOpt and compressed-tensors (one global the fused tensor shares, no
bounds recorded) and MLX (bounds and one global a partition recorded). ``nvfp4 shard`` at
TP 2 and 3 (uneven heads) and TP 8 with an alignment of 8 blocks (KV heads replicated, a
padded last rank) records the partition plans in the manifest; every rank equals cutting
each partition separately and concatenating, byte for byte; ``nvfp4 verify`` says SAME
and reassembles the fused tensors; ``load_rank`` gives the same pieces from the source
(reading each partition's rows of the rank only) and from DST; the sharded matmul equals
the reference within the spec's tolerances; a GGUF (super-block alignment) shards the same
way, each rank's file giving its own head counts; bad input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4.fused_plan import FusedPlan
from nvfp4.fusion import fuse
from nvfp4.planes import NVFP4Planes
from nvfp4.reference import qmm
from nvfp4.shard_plan import head_plan, shard_plan
from nvfp4.tolerances import tolerance
from nvfp4_checkpoints import CheckpointError, load_rank, open_checkpoint, write_checkpoint
from nvfp4_checkpoints.cli import main
from nvfp4_checkpoints.shard import MANIFEST, rank_checkpoint, shard_checkpoint, verify_sharded
from small_models import llama_config

FLAVOURS = ("modelopt", "compressed-tensors", "mlx")
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER = 9, 3, 64, 576, 1856
LAYER = "model.layers.0."
QKV, O_PROJ = LAYER + "self_attn.qkv_proj", LAYER + "self_attn.o_proj"
GATE_UP, DOWN = LAYER + "mlp.gate_up_proj", LAYER + "mlp.down_proj"
SPLITS = [(2, 1), (3, 1), (8, 8)]  # (tp, align blocks)
LABELS = {QKV: ("q", "k", "v"), GATE_UP: ("gate", "up")}


def config() -> dict[str, Any]:
    return llama_config(
        hidden=HIDDEN,
        intermediate=INTER,
        kv_heads=KV_HEADS,
        num_attention_heads=HEADS,
        head_dim=HEAD_DIM,
    )


@pytest.fixture(scope="module")
def layer() -> dict[str, list[NVFP4Planes]]:
    """Each fused tensor's partitions, quantized apart (their own globals)."""
    rng = np.random.default_rng(960)

    def q(rows: int, k: int, name: str) -> NVFP4Planes:
        return quantize(rng.standard_normal((rows, k), dtype=np.float32) * rows, name=name)

    return {
        QKV: [q(HEADS * HEAD_DIM, HIDDEN, "q"), q(KV_HEADS * 64, HIDDEN, "k"), q(192, HIDDEN, "v")],
        GATE_UP: [q(INTER, HIDDEN, "gate"), q(INTER, HIDDEN, "up")],
        O_PROJ: [q(HIDDEN, HEADS * HEAD_DIM, "o")],
        DOWN: [q(HIDDEN, INTER, "down")],
    }


def fused(parts: list[NVFP4Planes], name: str, flavour: str) -> NVFP4Planes:
    """As the flavour stores it: MLX keeps every partition's global and the bounds;
    ModelOpt and compressed-tensors one global the partitions share (the first's here)."""
    if len(parts) == 1:
        return parts[0].replace(name=name)
    if flavour == "mlx":
        return fuse(parts, name)
    return NVFP4Planes(
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.scales for p in parts]),
        parts[0].global_scale,
        name=name,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, layer: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fused")
    norm = {LAYER + "input_layernorm.weight": np.ones(HIDDEN, np.float32)}
    return {
        f: write_checkpoint(
            root / f,
            {name: fused(parts, name, f) for name, parts in layer.items()},
            flavour=f,
            tensors=norm,
            config=config(),
        )
        for f in FLAVOURS
    }


def expected_plans(tp: int, align: int) -> dict[str, list[tuple[int, int, int]]]:
    """Each partition's [start, stop, padded] by rank, from the plans of the separate
    layers: q by heads, k/v by the KV heads each rank's queries read, gate/up by down's K."""
    h = head_plan(HEADS, KV_HEADS, HEAD_DIM, tp)
    k = shard_plan(INTER, tp, dim="k", align=align)
    kv = [(a, b, b - a) for a, b in (h.kv_rows(r) for r in range(tp))]
    return {
        "q": [(r.start, r.stop, r.padded) for r in h.q_rows()],
        "k": kv,
        "v": kv,
        "gate": [(r.start, r.stop, r.padded) for r in k],
        "up": [(r.start, r.stop, r.padded) for r in k],
    }


def cut_separately(parts: list[NVFP4Planes], ranges: list[tuple[int, int, int]]) -> np.ndarray:
    """A rank's codes and scales the long way: every partition's rows [start, stop) and
    its zero rows to its padded size, concatenated (codes and scale bytes side by side)."""
    rows = []
    for p, (a, b, padded) in zip(parts, ranges, strict=True):
        both = np.concatenate([p.codes[a:b], p.scales[a:b]], axis=1)
        rows += [both, np.zeros((padded - (b - a), both.shape[1]), np.uint8)]
    return np.concatenate(rows)


def rows_of(p: NVFP4Planes) -> np.ndarray:
    return np.concatenate([p.codes, p.scales], axis=1)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(("tp", "align"), SPLITS)
def test_fused_tensors_shard_per_partition_and_verify(
    tmp_path: Path, sources: dict[str, Path], layer: Any, flavour: str, tp: int, align: int
) -> None:
    src = sources[flavour]
    dst = shard_checkpoint(src, tmp_path / "dst", tp=tp, align=align)
    manifest = json.loads((dst / MANIFEST).read_text())
    want = expected_plans(tp, align)
    for name, labels in LABELS.items():
        entry = manifest["tensors"][name]
        assert entry["dim"] == "fused"
        assert [p["label"] for p in entry["partitions"]] == list(labels)
        for p in entry["partitions"]:
            assert [tuple(r) for r in p["ranks"]] == want[p["label"]]
    verdict = verify_sharded(src, dst)
    assert verdict.startswith("SAME")
    assert "2 fused tensors reassembled per partition" in verdict
    for rank in range(tp):
        with open_checkpoint(dst / f"rank-{rank}") as part:
            written = {name: part.planes(name) for name in LABELS}
        from_src = load_rank(src, rank, tp, align=align)
        from_dst = load_rank(dst, rank, tp)
        for name, labels in LABELS.items():
            ranges = [want[x][rank] for x in labels]
            expect = cut_separately(layer[name], ranges).tobytes()
            got = written[name]
            assert rows_of(got).tobytes() == expect
            assert rows_of(from_src.planes[name]).tobytes() == expect
            assert rows_of(from_dst.planes[name]).tobytes() == expect
            assert isinstance(from_src.plans[name], FusedPlan)
            assert from_dst.plans[name] == from_src.plans[name]
            if flavour == "mlx":  # every partition's global, the rank's own bounds
                assert got.global_scale.shape == (len(ranges),)
                bounds = tuple(np.cumsum([0] + [r[2] for r in ranges]).tolist())
                assert got.partitions == bounds
                assert from_src.planes[name].partitions == bounds
            else:  # the one global the partitions share
                assert got.partitions is None
                assert got.global_scale.size == 1
        # only the rank's bytes are read: its rows of each partition, its K columns
        read = from_src.bytes_read - sum(t.nbytes for t in from_src.tensors.values())
        rows = sum(r[1] - r[0] for x in ("q", "k", "v", "gate", "up") for r in [want[x][rank]])
        k_cols = {O_PROJ: from_src.plans[O_PROJ], DOWN: from_src.plans[DOWN]}
        cols = sum(p[rank].size for p in k_cols.values() if not isinstance(p, FusedPlan))
        globals_read = sum(p.global_scale.nbytes for p in from_src.planes.values())
        assert read == (rows + cols) * (HIDDEN // 2 + HIDDEN // 16) + globals_read


@pytest.mark.parametrize(("tp", "align"), SPLITS)
def test_the_sharded_layer_multiplies_to_the_reference(
    tmp_path: Path, sources: dict[str, Path], tp: int, align: int
) -> None:
    """q/k/v column-parallel (each partition's rows equal to the reference's), gate/up
    column-parallel into down row-parallel (float32 partial sums), from the rank folders."""
    src = sources["mlx"]
    dst = shard_checkpoint(src, tmp_path / "dst", tp=tp, align=align)
    x = np.random.default_rng(tp).standard_normal((3, HIDDEN)).astype(np.float32)
    with open_checkpoint(src) as ck:
        ref_qkv = qmm(x, ck.planes(QKV), out_dtype=None)
        gu = qmm(x, ck.planes(GATE_UP), out_dtype=None)
        ref = qmm(np.maximum(gu[:, :INTER], 0) * gu[:, INTER:], ck.planes(DOWN), out_dtype=None)
    total = np.zeros((3, HIDDEN), np.float32)
    for rank in range(tp):
        shard = load_rank(dst, rank, tp)
        plan = shard.plans[QKV]
        assert isinstance(plan, FusedPlan)
        y = qmm(x, shard.planes[QKV], out_dtype=np.float32)
        for i, part in enumerate(plan):
            r, lo = part[rank], plan.rank_bounds(rank)[i]
            got = y[:, lo : lo + r.size].astype(np.float64)
            want = ref_qkv[:, plan.bounds[i] + r.start : plan.bounds[i] + r.stop]
            assert np.max(np.abs(got - want)) <= tolerance("qmm", "float32") * np.max(np.abs(want))
        g = qmm(x, shard.planes[GATE_UP], out_dtype=None)
        half = g.shape[1] // 2
        h = np.maximum(g[:, :half], 0) * g[:, half:]
        total += qmm(h, shard.planes[DOWN], out_dtype=None).astype(np.float32)
    rel = np.max(np.abs(total - ref)) / np.max(np.abs(ref))
    assert rel <= tolerance("row_parallel", "float32", spec="1.2")


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_bad_fused_input_is_refused_in_one_line(
    tmp_path: Path, sources: dict[str, Path], layer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src = sources["modelopt"]
    # more ranks than query heads: the tensor, the partition, the split and the unit named
    qkv = write_checkpoint(
        tmp_path / "qkv",
        {QKV: fused(layer[QKV], QKV, "modelopt")},
        flavour="modelopt",
        config=config(),
    )
    one_line(
        capsys,
        ["shard", str(qkv), str(tmp_path / "t"), "--tp", "16"],
        str(qkv),
        repr(QKV),
        "partition q: 9 heads split over 16 ranks",
        "units of 1",
    )
    assert not (tmp_path / "t").exists()
    # a fused q/k/v whose rows are not the config's heads
    odd = write_checkpoint(
        tmp_path / "odd",
        {QKV: fused(layer[QKV][:2], QKV, "modelopt")},
        flavour="modelopt",
        config=config(),
    )
    one_line(
        capsys,
        ["shard", str(odd), str(tmp_path / "t2"), "--tp", "2"],
        repr(QKV),
        "N of the fused tensor (partitions q, k, v): expected 960 by 9 heads",
        "found 768",
    )
    # an MLX tensor whose recorded bounds are not the heads'
    bad = fuse(layer[QKV], QKV).replace(partitions=(0, 640, 800, 960))
    mlx = write_checkpoint(tmp_path / "mlx", {QKV: bad}, flavour="mlx", config=config())
    one_line(
        capsys,
        ["shard", str(mlx), str(tmp_path / "t3"), "--tp", "2"],
        "recorded partition bounds: expected (0, 576, 768, 960) by the fused plan",
        "found (0, 640, 800, 960)",
    )
    # a manifest whose partition range disagrees with the plan: verify and load_rank refuse
    dst = shard_checkpoint(src, tmp_path / "dst", tp=2)
    where = dst / MANIFEST
    m = json.loads(where.read_text())
    m["tensors"][QKV]["partitions"][1]["ranks"][0] = [0, 64, 64]
    where.write_text(json.dumps(m))
    one_line(
        capsys,
        ["verify", str(src), str(dst)],
        str(where),
        f"{QKV!r}: partition k: rank 0's [start, stop, padded]: expected [0, 128, 128] by the "
        "plan, found [0, 64, 64]",
    )
    with pytest.raises(CheckpointError) as e:
        load_rank(dst, 0, 2)
    assert "\n" not in str(e.value)
    assert f"{QKV!r}: expected N = 576 (the manifest's rank 0), found 640" in str(e.value)
    m["tensors"][QKV]["partitions"][1]["ranks"][0] = [0, 128, 128]
    m["tensors"][QKV]["partitions"].pop()
    where.write_text(json.dumps(m))
    one_line(
        capsys,
        ["verify", str(src), str(dst)],
        "partitions: expected ['q', 'k', 'v'] by the plan, found ['q', 'k']",
    )


@pytest.mark.parametrize(("tp", "align"), [(2, 4), (3, 4), (8, 8)])
def test_a_gguf_shards_fused_tensors_per_partition(
    tmp_path: Path, layer: Any, tp: int, align: int
) -> None:
    """GGUF (one global a tensor, K in 64-value super-blocks): the same per-partition cut,
    every rank's file saying the query and KV heads and the (padded) intermediate size it
    holds."""
    pytest.importorskip("gguf")
    src = write_checkpoint(
        tmp_path / "layer.gguf",
        {name: fused(parts, name, "gguf") for name, parts in layer.items()},
        flavour="gguf",
        config=config(),
    )
    dst = shard_checkpoint(src, tmp_path / "dst", tp=tp, align=align)
    assert "2 fused tensors reassembled per partition" in verify_sharded(src, dst)
    want = expected_plans(tp, align)
    h = head_plan(HEADS, KV_HEADS, HEAD_DIM, tp)
    for rank in range(tp):
        with open_checkpoint(rank_checkpoint(dst, rank)) as part:
            for name, labels in LABELS.items():
                expect = cut_separately(layer[name], [want[x][rank] for x in labels])
                assert rows_of(part.planes(name)).tobytes() == expect.tobytes()
            kv = h.kv[rank]
            assert part.config["num_attention_heads"] == h.q[rank].size
            assert part.config["num_key_value_heads"] == kv[1] - kv[0]
            assert part.config["intermediate_size"] == want["gate"][rank][2]  # padded
