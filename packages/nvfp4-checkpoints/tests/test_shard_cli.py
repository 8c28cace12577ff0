"""``nvfp4 shard SRC DST [--tp N] [--ep M] [--align A]`` and ``nvfp4 verify SRC DST`` of a
sharded DST (spec 1.2, "Sharding"): per-rank checkpoints of SRC's flavour that open
alone (one ``.gguf`` a rank for GGUF), a manifest of every rank's range, Nemotron-3-Nano's
1,856 and a 2,880 K whose sharded matmul sums to the unsharded reference, zero padding
(zero GGUF super-blocks included), experts dealt to EP ranks with their globals, and bad
input refused with exit 2 and one line naming the file, nothing written outside DST."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4 import quantize, reference
from nvfp4.fusion import stack_experts
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import ShardPlan, ShardRange
from nvfp4.shard_planes import reassemble
from nvfp4_checkpoints import CheckpointError, load_rank, open_checkpoint, write_checkpoint
from nvfp4_checkpoints.cli import main
from nvfp4_checkpoints.shard import MANIFEST, rank_checkpoint
from small_models import byte_level_bpe, llama_config

FLAVOURS = ["modelopt", "compressed-tensors", "mlx", "gguf"]
DOWN = "model.layers.0.mlp.down_proj"


def _needs(flavour: str) -> None:
    if flavour == "gguf":
        pytest.importorskip("gguf")


def _write(path: Path, planes: dict[str, NVFP4Planes], flavour: str, **kw: Any) -> Path:
    _needs(flavour)
    if flavour == "gguf":
        path = path.with_suffix(".gguf")
    return write_checkpoint(path, planes, flavour=flavour, **kw)


def mlp_checkpoint(path: Path, hidden: int, inter: int, flavour: str = "modelopt") -> Path:
    """One Llama MLP block (gate/up [inter, hidden], down [hidden, inter]) and a norm."""
    rng = np.random.default_rng([hidden, inter])
    layer = "model.layers.0.mlp."
    dense = {
        layer + "gate_proj": rng.standard_normal((inter, hidden), dtype=np.float32),
        layer + "up_proj": rng.standard_normal((inter, hidden), dtype=np.float32),
        layer + "down_proj": rng.standard_normal((hidden, inter), dtype=np.float32),
    }
    planes = {name: quantize(w, name=name) for name, w in dense.items()}
    config = llama_config(hidden=hidden, intermediate=inter, vocab=256)
    norm = {"model.layers.0.post_attention_layernorm.weight": np.ones(hidden, np.float32)}
    return _write(path, planes, flavour, tensors=norm, config=config)


def run(*argv: str) -> int:
    return main(list(argv))


def manifest_of(dst: Path) -> dict[str, Any]:
    return json.loads((dst / MANIFEST).read_text())


def rank_planes(dst: Path, rank: int, name: str) -> NVFP4Planes:
    with open_checkpoint(rank_checkpoint(dst, rank)) as part:
        p = part.planes(name)
        return type(p)(p.codes.copy(), p.scales.copy(), p.global_scale.copy(), name=name)


def plan_of(entry: dict[str, Any], name: str) -> ShardPlan:
    ranks = tuple(ShardRange(i, *r) for i, r in enumerate(entry["ranks"]))
    return ShardPlan(name, entry["dim"], entry["size"], len(ranks), entry["unit"], ranks)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("tp", [2, 3])
def test_every_flavour_shards_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flavour: str, tp: int
) -> None:
    src = mlp_checkpoint(tmp_path / "src", 128, 256, flavour)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp)) == 0
    manifest = manifest_of(dst)
    assert (manifest["tp"], manifest["ep"], manifest["world"]) == (tp, 1, tp)
    assert manifest["flavour"] == flavour
    assert manifest["spec_version"] == "1.2"
    assert manifest["align_blocks"] == (4 if flavour == "gguf" else 1)
    down = manifest["tensors"][DOWN]
    gate = manifest["tensors"]["model.layers.0.mlp.gate_proj"]
    assert down["dim"] == "k"
    assert gate["dim"] == "n"
    assert gate["ranks"] == down["ranks"]  # the paired rule
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [MANIFEST, *(f"rank-{r}" for r in range(tp))]
    )
    for rank, (start, stop, padded) in enumerate(down["ranks"]):
        path = rank_checkpoint(dst, rank)
        if flavour == "gguf":  # one file a rank, named as the source
            assert path == dst / f"rank-{rank}" / src.name
            assert [p.name for p in path.parent.iterdir()] == [src.name]
        with open_checkpoint(path) as part:  # each rank opens alone
            assert part.flavour == flavour
            assert part.planes(DOWN).k == padded
            assert part.planes("model.layers.0.mlp.up_proj").n == padded
            unit = 64 if flavour == "gguf" else 16
            assert start % unit == 0
            assert stop % unit == 0
            assert part.tensor_names() == ["model.layers.0.post_attention_layernorm.weight"]
    capsys.readouterr()
    assert run("verify", str(src), str(dst)) == 0
    assert capsys.readouterr().out.startswith(f"SAME (sharded, tp={tp}")


def sharded_down(dst: Path, tp: int, name: str) -> list[NVFP4Planes]:
    return [rank_planes(dst, rank, name) for rank in range(tp)]


def sums_to_reference(src: Path, dst: Path, tp: int, hidden: int, inter: int) -> None:
    """Every rank's partial matmul (its K slice of x, zero in its padding) sums to the
    unsharded reference."""
    ranks = manifest_of(dst)["tensors"][DOWN]["ranks"]
    shards = sharded_down(dst, tp, DOWN)
    with open_checkpoint(src) as ck:
        whole = ck.planes(DOWN)
    x = np.random.default_rng(1).standard_normal((3, inter)).astype(np.float32)
    total = np.zeros((3, hidden))
    for (a, b, padded), shard in zip(ranks, shards, strict=True):
        xr = np.zeros((3, padded), np.float32)
        xr[:, : b - a] = x[:, a:b]
        total += reference.qmm(xr, shard, out_dtype=None)
    np.testing.assert_allclose(
        total, reference.qmm(x, whole, out_dtype=None), rtol=1e-12, atol=1e-9
    )


@pytest.mark.parametrize(
    ("hidden", "inter", "align"), [(64, 1856, 1), (64, 1856, 8), (2880, 512, 1)]
)
def test_the_sharded_matmul_sums_to_the_reference(
    tmp_path: Path, hidden: int, inter: int, align: int
) -> None:
    # 1,856: Nemotron-3-Nano's routed expert (232 a rank at TP8 is not a multiple of 16)
    src = mlp_checkpoint(tmp_path / "src", hidden, inter)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "8", "--align", str(align)) == 0
    ranks = manifest_of(dst)["tensors"][DOWN]["ranks"]
    if inter == 1856 and align == 1:
        assert [(b - a) // 16 for a, b, _ in ranks] == [15] * 4 + [14] * 4
    if align == 8:  # 14.5 units of 128: rank 7 holds 64 values and 64 of zero padding
        assert ranks[7] == [1792, 1856, 128]
        shard = sharded_down(dst, 8, DOWN)[7]
        assert not shard.codes[:, 32:].any()
        assert not shard.scales[:, 4:].any()
    sums_to_reference(src, dst, 8, hidden, inter)
    assert run("verify", str(src), str(dst)) == 0


def gguf_down_data(path: Path) -> np.ndarray[Any, Any]:
    """The raw GGUF bytes of the down projection of the file at ``path``."""
    from nvfp4_checkpoints.gguf.file import GGUFFile

    f = GGUFFile(path)
    try:
        name = next(n for n in f.tensors if n.endswith("ffn_down.weight"))
        return np.array(f.array(f.tensors[name]))
    finally:
        f.close()


@pytest.mark.parametrize("tp", [2, 3, 8])
@pytest.mark.parametrize("inter", [1856, 2880])
@pytest.mark.parametrize("align", [4, 8])
def test_gguf_shards_at_super_blocks_and_pads_with_zero_blocks(
    tmp_path: Path, tp: int, inter: int, align: int
) -> None:
    gguf = pytest.importorskip("gguf")
    src = mlp_checkpoint(tmp_path / "src", 64, inter, "gguf")
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp), "--align", str(align)) == 0
    ranks = manifest_of(dst)["tensors"][DOWN]["ranks"]
    unit = 16 * align
    units = -(-inter // unit)
    q, r = divmod(units, tp)
    assert [(p // unit) for _, _, p in ranks] == [q + 1] * r + [q] * (tp - r)
    assert all(a % 64 == 0 and p % 64 == 0 for a, _, p in ranks)
    padding = ranks[-1][2] - (ranks[-1][1] - ranks[-1][0])
    # 1,856 and 2,880 are whole super-blocks: padding only with units of 128 (half a unit)
    assert padding == (64 if align == 8 else 0)
    for rank, (a, b, padded) in enumerate(ranks):
        data = gguf_down_data(rank_checkpoint(dst, rank))
        assert data.shape == (64, padded // 64 * 36)
        # gguf-py's own decoder (no nvfp4 code): the rank's weights exactly, padding 0.0
        decoded = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.NVFP4)
        with open_checkpoint(src) as ck:
            whole = reference.dequantize_unscaled(ck.planes(DOWN))
        np.testing.assert_array_equal(decoded[:, : b - a], whole[:, a:b])
        if padded > b - a:
            assert not data[:, (b - a) // 64 * 36 :].any()  # zero bytes: scales and codes
            assert np.all(decoded[:, b - a :] == 0.0)
    sums_to_reference(src, dst, tp, 64, inter)
    assert run("verify", str(src), str(dst)) == 0


def test_gguf_ranks_keep_the_tokenizer_and_metadata(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from nvfp4_checkpoints.gguf.file import GGUFFile

    vocab = 300
    tok = byte_level_bpe(
        tmp_path / "tok", [], ["<s>"], corpus=["hello world, a tokenizer"] * 8, vocab_size=vocab
    )
    rng = np.random.default_rng(5)
    planes = {
        DOWN: quantize(rng.standard_normal((64, 256), dtype=np.float32), name=DOWN),
        "model.layers.0.mlp.up_proj": quantize(rng.standard_normal((256, 64), dtype=np.float32)),
    }
    src = _write(
        tmp_path / "src",
        planes,
        "gguf",
        tensors={"model.embed_tokens.weight": rng.standard_normal((vocab, 64), dtype=np.float32)},
        config=llama_config(hidden=64, intermediate=256, vocab=vocab),
        tokenizer=tok,
    )
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "2") == 0
    whole = GGUFFile(src)
    try:
        keys = [k for k in whole.fields if k.startswith(("tokenizer.", "general.", "llama."))]
        assert any(k.startswith("tokenizer.ggml.") for k in keys)
        for rank in range(2):
            part = GGUFFile(rank_checkpoint(dst, rank))
            try:
                for key in keys:
                    if key == "llama.feed_forward_length":  # the rank's: 256 = 2 x 128
                        assert (whole.value(key), part.value(key)) == (256, 128)
                    else:
                        assert part.value(key) == whole.value(key), key
                assert part.tensors["blk.0.ffn_down.weight"].ggml_type == 40  # NVFP4
            finally:
                part.close()
    finally:
        whole.close()
    assert run("verify", str(src), str(dst)) == 0


def attention_planes(hidden: int, heads: int, kv_heads: int) -> dict[str, NVFP4Planes]:
    rng = np.random.default_rng(9)
    dim = hidden // heads
    shapes = {
        "q_proj": (heads * dim, hidden),
        "k_proj": (kv_heads * dim, hidden),
        "v_proj": (kv_heads * dim, hidden),
        "o_proj": (hidden, heads * dim),
    }
    return {
        f"model.layers.0.self_attn.{p}": quantize(rng.standard_normal(s, dtype=np.float32), name=p)
        for p, s in shapes.items()
    }


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_gguf_attention_splits_by_heads_and_each_rank_says_its_heads(
    tmp_path: Path, tp: int
) -> None:
    # llama GGUFs store q/k RoPE-permuted per head: a rank's head counts are its own
    pytest.importorskip("gguf")
    from nvfp4_checkpoints.gguf.file import GGUFFile

    config = llama_config(hidden=256, kv_heads=2)  # 4 heads of 64, 2 KV heads
    src = _write(tmp_path / "src", attention_planes(256, 4, 2), "gguf", config=config)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp)) == 0
    q = manifest_of(dst)["tensors"]["model.layers.0.self_attn.q_proj"]["ranks"]
    for rank, (a, b, _) in enumerate(q):
        f = GGUFFile(rank_checkpoint(dst, rank))
        try:
            assert f.value("llama.attention.head_count") == (b - a) // 64
            kv = f.tensors["blk.0.attn_k.weight"].shape[-2] // 64
            assert f.value("llama.attention.head_count_kv") == kv
        finally:
            f.close()
    assert run("verify", str(src), str(dst)) == 0


# ============================================================================ experts
def moe_planes(experts: int, hidden: int, inter: int, stacked: bool) -> dict[str, NVFP4Planes]:
    """One MoE block: gate/up/down of ``experts`` experts (each its own global), per-expert
    ``mlp.experts.{}.<proj>`` or a stacked ``mlp.switch_mlp.<proj>``, and attention."""
    rng = np.random.default_rng([experts, inter])
    out: dict[str, NVFP4Planes] = {}
    projections = {
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }
    for proj, shape in projections.items():
        key = f"model.layers.0.mlp.{'switch_mlp' if stacked else 'experts.{}'}.{proj}"
        parts = [
            quantize(rng.standard_normal(shape, dtype=np.float32) * (e + 1), name=proj)
            for e in range(experts)
        ]
        out[key] = stack_experts(parts, name=key)
    out["model.layers.0.self_attn.o_proj"] = quantize(
        rng.standard_normal((hidden, hidden), dtype=np.float32), name="o_proj"
    )
    return out


def moe_config(hidden: int, inter: int, experts: int) -> dict[str, Any]:
    return llama_config(
        hidden=hidden,
        intermediate=inter,
        kv_heads=4,
        num_local_experts=experts,
        num_experts_per_tok=2,
    )


@pytest.mark.parametrize(
    ("flavour", "stacked"),
    [
        ("modelopt", False),
        ("compressed-tensors", False),
        ("gguf", False),
        ("gguf", True),
        ("mlx", False),
        ("mlx", True),
    ],
)
@pytest.mark.parametrize(("tp", "ep"), [(1, 2), (2, 2), (1, 3)])
def test_experts_go_to_ranks_by_index_with_their_globals(
    tmp_path: Path, flavour: str, stacked: bool, tp: int, ep: int
) -> None:
    experts, hidden, inter = 5, 256, 128
    whole = moe_planes(experts, hidden, inter, stacked)
    src = _write(tmp_path / "src", whole, flavour, config=moe_config(hidden, inter, experts))
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp), "--ep", str(ep)) == 0
    manifest = manifest_of(dst)
    assert (manifest["tp"], manifest["ep"], manifest["world"]) == (tp, ep, tp * ep)
    q, r = divmod(experts, ep)
    counts = [q + 1] * r + [q] * (ep - r)
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    want_experts = [[bounds[e], bounds[e + 1], counts[e]] for e in range(ep)]
    assert len(manifest["experts"]) == 3  # gate, up, down
    for entry in manifest["experts"].values():
        assert entry["dim"] == "experts"
        assert entry["ranks"] == want_experts
        assert entry["stacked"] is stacked
    for proj in ("gate_proj", "up_proj", "down_proj"):
        key = f"model.layers.0.mlp.{'switch_mlp' if stacked else 'experts.{}'}.{proj}"
        for e in range(experts):
            ep_rank = next(i for i, (a, b, _) in enumerate(want_experts) if a <= e < b)
            local = e - want_experts[ep_rank][0]
            name = key.format(e) if not stacked else key
            tp_plan = plan_of(manifest["tensors"][name], name)
            pieces = []
            for tp_rank in range(tp):
                got = rank_planes(dst, ep_rank * tp + tp_rank, key.format(local))
                if stacked:  # the rank's stack holds its experts only
                    assert got.num_experts == counts[ep_rank]
                    got = type(got)(
                        got.codes[local], got.scales[local], got.global_scale[local], name=name
                    )
                pieces.append(got)
            expert = reassemble(pieces, tp_plan)  # TP shards back to the whole expert
            source = whole[key]
            np.testing.assert_array_equal(expert.codes, source.codes[e])
            np.testing.assert_array_equal(expert.scales, source.scales[e])
            # the global travels (a compressed-tensors global is a float32 reciprocal: 1 ulp)
            ulps = abs(
                int(expert.global_scale.view(np.int32))
                - int(source.global_scale[e : e + 1].view(np.int32)[0])
            )
            assert ulps <= (1 if flavour == "compressed-tensors" else 0)
    # the attention is split over TP and held by every EP group
    o = manifest["tensors"]["model.layers.0.self_attn.o_proj"]
    assert len(o["ranks"]) == tp
    for rank in range(tp * ep):
        got = rank_planes(dst, rank, "model.layers.0.self_attn.o_proj")
        assert got.k == o["ranks"][rank % tp][2]
    assert run("verify", str(src), str(dst)) == 0


# ========================================================================== bad input
def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _names(err: str, path: object) -> bool:
    """``err`` names ``path``: whole, or with the middle of a long leading path replaced by
    ``...`` as a one-line message over the length limit has it (``nvfp4.file_checks``):
    the same start, the same end."""
    whole = str(path)
    if whole in err:
        return True
    # every place "..." starts: a cut next to a "." of the path itself shows as "...."
    for at in (i for i in range(len(err) - 2) if err.startswith("...", i)):
        head, tail = err[:at].split(), err[at + 3 :].split(": ", 1)[0]
        if head and tail and whole.startswith(head[-1]) and whole.endswith(tail):
            return True
    return False


def test_a_cut_next_to_a_dot_of_the_path_still_names_it() -> None:
    """The elision of a long path can fall beside a "." of the path (``/tmp/x/.nox/...``
    cut after its dot shows ``/tmp/x/....package``): the path is still named; another path
    is not."""
    path = Path("/tmp/ci51875de/.nox/package-tests/dst/rank-1")
    assert _names("nvfp4: error: /tmp/ci51875de/....package-tests/dst/rank-1: bad", path)
    assert _names("nvfp4: error: /tmp/ci51875de/...package-tests/dst/rank-1: bad", path)
    assert not _names("nvfp4: error: /tmp/ci51875de/....other/dst/rank-1: bad", path)


@pytest.fixture
def refused(capsys: pytest.CaptureFixture[str]) -> Any:
    """``refused(*argv, match=..., names=...)``: exit 2, one line on stderr holding
    ``match`` and the file ``names``, with an expected and a found."""

    def check(*argv: str, match: str, names: Path) -> str:
        capsys.readouterr()
        assert run(*argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert match in err, err
        assert _names(err, names), err
        assert "expected" in err, err
        return err

    return check


def test_a_plan_that_cuts_a_block_is_refused(tmp_path: Path, refused: Any) -> None:
    src = mlp_checkpoint(tmp_path / "src", 128, 256)
    before = listing(tmp_path)
    # 256 / 16 = 16 blocks cannot feed 32 ranks: the plan would cut a block
    refused("shard", str(src), str(tmp_path / "t"), "--tp", "32", match="down_proj", names=src)
    refused("shard", str(src), str(tmp_path / "t"), "--tp", "0", match="--tp", names="--tp")
    refused("shard", str(src), str(tmp_path / "t"), "--ep", "2", match="--ep 2", names=src)
    refused("shard", str(src), str(tmp_path / "t"), "--ep", "0", match="--ep", names="--ep")
    refused(
        "shard", str(src), str(tmp_path / "t"), "--align", "0", match="--align", names="(blocks)"
    )
    assert listing(tmp_path) == before


def test_gguf_refuses_a_cut_inside_a_super_block(tmp_path: Path, refused: Any) -> None:
    pytest.importorskip("gguf")
    src = mlp_checkpoint(tmp_path / "src", 128, 256, "gguf")
    before = listing(tmp_path)
    refused(
        "shard",
        str(src),
        str(tmp_path / "t"),
        "--tp",
        "2",
        "--align",
        "2",
        match="--align 2",
        names=src,
    )
    # 256 = 4 super-blocks over 8 ranks
    refused("shard", str(src), str(tmp_path / "t"), "--tp", "8", match="down_proj", names=src)
    # head_dim 32: o_proj cut at heads falls inside a 64-value super-block at TP4
    attn = _write(
        tmp_path / "attn",
        attention_planes(128, 4, 4),
        "gguf",
        config=llama_config(hidden=128, kv_heads=4),
    )
    before = listing(tmp_path)
    err = refused("shard", str(attn), str(tmp_path / "t"), "--tp", "4", match="o_proj", names=attn)
    assert "super-block" in err
    # 10 heads over 2 KV heads at TP4: rank 1's 3 query heads read 2 KV heads
    gqa = _write(
        tmp_path / "gqa",
        attention_planes(640, 10, 2),
        "gguf",
        config={**llama_config(hidden=640, kv_heads=2), "num_attention_heads": 10},
    )
    before = listing(tmp_path)
    refused("shard", str(gqa), str(tmp_path / "t"), "--tp", "4", match="KV heads", names=gqa)
    assert listing(tmp_path) == before


def test_an_existing_dst_is_never_replaced_unless_empty(tmp_path: Path, refused: Any) -> None:
    src = mlp_checkpoint(tmp_path / "src", 128, 256)
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep me")
    a_file = tmp_path / "file"
    a_file.write_text("keep me too")
    before = listing(tmp_path)
    refused("shard", str(src), str(full), "--tp", "2", match="not empty", names=full)
    refused("shard", str(src), str(a_file), "--tp", "2", match="existing file", names=a_file)
    refused("shard", str(src), str(src / "inside"), "--tp", "2", match="inside", names=src)
    assert listing(tmp_path) == before
    assert listing(full) == ["mine.txt"]
    assert (full / "mine.txt").read_text() == "keep me"
    assert a_file.read_text() == "keep me too"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("shard", str(src), str(empty), "--tp", "2") == 0
    assert listing(empty) == sorted([MANIFEST, "rank-0", "rank-1"])
    assert listing(tmp_path) == sorted([*before, "empty"])


def test_a_src_that_is_no_checkpoint_is_refused(tmp_path: Path, refused: Any) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "readme.md").write_text("hello")
    before = listing(tmp_path)
    for src in (text, folder, tmp_path / "missing"):
        refused("shard", str(src), str(tmp_path / "t"), "--tp", "2", match="", names=src)
    assert listing(tmp_path) == before


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, Path]:
    src = mlp_checkpoint(tmp_path / "src", 128, 768)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "3") == 0
    return src, dst


def test_verify_refuses_a_manifest_that_disagrees_with_the_plan(
    sharded: tuple[Path, Path], refused: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = sharded
    where = dst / MANIFEST
    good = where.read_text()
    for change, match in (
        (lambda m: m["tensors"][DOWN]["ranks"][0].__setitem__(1, 240), repr(DOWN)),  # a range
        (lambda m: m["tensors"][DOWN].__setitem__("size", 512), repr(DOWN)),  # a size
        (lambda m: m.__setitem__("tp", 2), "world: expected 2"),  # the world size
        (lambda m: m.__setitem__("world", 4), "world"),
        (lambda m: m["tensors"].pop(DOWN), "tensors"),
        (lambda m: m.__setitem__("tp", "3"), "tp"),
    ):
        m = json.loads(good)
        change(m)
        where.write_text(json.dumps(m))
        refused("verify", str(src), str(dst), match=match, names=where)
    where.write_text("{not json")
    refused("verify", str(src), str(dst), match="JSON", names=where)
    # a hostile manifest is refused before it is parsed: nested past the depth every JSON
    # reader keeps (a parser's recursion), and the same through load_rank
    where.write_text('{"tensors": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert run("verify", str(src), str(dst)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "nested 100001 levels deep" in err, err
    assert _names(err, where), err
    with pytest.raises(CheckpointError, match="nested") as e:
        load_rank(dst, 0, 3)
    assert str(where) in str(e.value)
    where.write_text(good)
    assert run("verify", str(src), str(dst)) == 0


def test_verify_refuses_rank_folders_that_disagree_with_the_manifest(
    sharded: tuple[Path, Path], refused: Any, tmp_path: Path
) -> None:
    src, dst = sharded
    # a shape: rank 1 of a TP2 sharding (384 of K) where TP3's rank 1 (256) belongs
    other = tmp_path / "other"
    assert run("shard", str(src), str(other), "--tp", "2") == 0
    shutil.move(dst / "rank-1", tmp_path / "kept")
    shutil.copytree(other / "rank-1", dst / "rank-1")
    err = refused("verify", str(src), str(dst), match="shape", names=dst / "rank-1")
    assert "[128, 128]" in err  # expected: 256 values of K are 128 code bytes
    shutil.rmtree(dst / "rank-1")
    # a rank folder missing
    refused("verify", str(src), str(dst), match="missing", names=dst / "rank-1")
    shutil.move(tmp_path / "kept", dst / "rank-1")
    assert run("verify", str(src), str(dst)) == 0
    # one rank folder too many (the world size)
    shutil.copytree(dst / "rank-2", dst / "rank-3")
    refused("verify", str(src), str(dst), match="3 rank folders", names=dst / "rank-3")
    shutil.rmtree(dst / "rank-3")
    # a rank with a tensor too many
    extra = tmp_path / "extra"
    with open_checkpoint(dst / "rank-0") as part:
        planes = {n: part.planes(n) for n in part.quantized_names()}
        planes["model.layers.0.mlp.extra_proj"] = planes[DOWN]
        write_checkpoint(
            extra,
            planes,
            flavour="modelopt",
            tensors={n: part.tensor(n) for n in part.tensor_names()},
            config=part.config,
        )
    shutil.rmtree(dst / "rank-0")
    shutil.move(extra, dst / "rank-0")
    refused("verify", str(src), str(dst), match="extra_proj", names=dst / "rank-0")


def write_llama_cpp_gguf(
    path: Path, arch: str, shapes: dict[str, tuple[int, int]], **hparams: int
) -> dict[str, np.ndarray[Any, Any]]:
    """A GGUF as llama.cpp's converter writes one (no ``nvfp4.*`` keys, no config:
    hyper-parameters in the metadata, no ``.scale`` of 1.0) of architecture ``arch``: random
    valid NVFP4 tensors ``<base>.weight`` of logical ``shapes`` (N, K), ``blk.0.ffn_down``'s
    global 0.25, an output norm; ``hparams`` by their gguf-py writer method
    (``head_count=4`` -> ``add_head_count(4)``). Returns every NVFP4 tensor's raw bytes."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    for key, value in hparams.items():
        getattr(w, f"add_{key}")(value)
    raw = {}
    for base, (n, k) in shapes.items():
        b = rng.integers(0, 256, (n, k // 64, 36), dtype=np.uint8)
        b[..., :4] = rng.integers(0x08, 0x7F, (n, k // 64, 4), dtype=np.uint8)  # valid scales
        raw[base] = b.reshape(n, -1)
        w.add_tensor(f"{base}.weight", raw[base], raw_dtype=gguf.GGMLQuantizationType.NVFP4)
    w.add_tensor("blk.0.ffn_down.scale", np.array([0.25], np.float32))
    w.add_tensor("output_norm.weight", np.ones(hparams["embedding_length"], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw


def foreign_gguf(path: Path) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    """A llama GGUF as llama.cpp's converter writes one (:func:`write_llama_cpp_gguf`; q/k
    rows RoPE-permuted): 4 heads of 64, 2 KV heads. Returns the path and every NVFP4
    tensor's raw bytes."""
    shapes = {
        "blk.0.attn_q": (256, 256),
        "blk.0.attn_k": (128, 256),
        "blk.0.attn_output": (256, 256),
        "blk.0.ffn_gate": (512, 256),
        "blk.0.ffn_down": (256, 512),
    }
    raw = write_llama_cpp_gguf(
        path, "llama", shapes, embedding_length=256, head_count=4, head_count_kv=2
    )
    return path, raw


def super_blocks(a: np.ndarray[Any, Any], start: int, stop: int) -> np.ndarray[Any, Any]:
    """The bytes of K values ``[start, stop)`` of every row of a GGUF NVFP4 tensor's raw
    ``[N, K / 64 * 36]`` bytes (whole 36-byte super-blocks)."""
    return a[:, start // 64 * 36 : stop // 64 * 36]


@pytest.mark.parametrize("tp", [2, 4])
def test_a_llama_cpp_gguf_shards_as_slices_of_its_bytes(tmp_path: Path, tp: int) -> None:
    # the plan from llama.cpp's names and the metadata's heads; every rank's NVFP4 data is a
    # slice of the source file's: whole rows (heads, RoPE-permuted per head; at TP4 the 2 KV
    # heads are replicated) or whole 36-byte super-blocks of every row
    from nvfp4_checkpoints.gguf.file import GGUFFile

    src, raw = foreign_gguf(tmp_path / "foreign.gguf")
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp)) == 0
    tensors = manifest_of(dst)["tensors"]
    assert tensors["blk.0.ffn_down"]["dim"] == "k"
    assert tensors["blk.0.attn_output"]["dim"] == "k"
    assert tensors["blk.0.ffn_gate"]["ranks"] == tensors["blk.0.ffn_down"]["ranks"]
    assert tensors["blk.0.attn_q"]["unit"] == 64  # whole heads
    for rank in range(tp):
        f = GGUFFile(rank_checkpoint(dst, rank))
        try:
            assert f.value("general.architecture") == "llama"
            q = tensors["blk.0.attn_q"]["ranks"][rank]
            assert f.value("llama.attention.head_count") == (q[1] - q[0]) // 64
            for base, entry in tensors.items():
                a, b, padded = entry["ranks"][rank]
                got = np.array(f.array(f.tensors[f"{base}.weight"]))
                want = raw[base][a:b] if entry["dim"] == "n" else super_blocks(raw[base], a, b)
                assert padded == b - a
                np.testing.assert_array_equal(got, want, err_msg=f"{base} rank {rank}")
            assert f.array(f.tensors["blk.0.ffn_down.scale"]).tolist() == [0.25]
        finally:
            f.close()
    assert run("verify", str(src), str(dst)) == 0


@pytest.mark.parametrize("tp", [2, 4])
def test_a_llama_cpp_phi3_gguf_splits_its_fused_tensors_per_partition(
    tmp_path: Path, tp: int
) -> None:
    # llama.cpp's Phi-3 stores gate_up_proj as blk.<i>.ffn_up (twice feed_forward_length
    # rows, no ffn_gate) and q/k/v as attn_qkv: each rank holds its range of gate and of up
    # (the down projection's K plan: 448 = 7 super-blocks, 4 + 3 at TP2, 2 + 2 + 2 + 1 at
    # TP4) and of q, k and v by whole heads, and its metadata gives the width and heads it
    # holds (llama.cpp takes a file's shapes from its metadata)
    from nvfp4_checkpoints.gguf.file import GGUFFile

    heads, kv_heads, head_dim, hidden, inter = 4, 2, 64, 256, 448
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    shapes = {
        "blk.0.attn_qkv": (q_rows + 2 * kv_rows, hidden),
        "blk.0.attn_output": (hidden, q_rows),
        "blk.0.ffn_up": (2 * inter, hidden),
        "blk.0.ffn_down": (hidden, inter),
    }
    src = tmp_path / "phi3.gguf"
    raw = write_llama_cpp_gguf(
        src,
        "phi3",
        shapes,
        embedding_length=hidden,
        feed_forward_length=inter,
        head_count=heads,
        head_count_kv=kv_heads,
    )
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp)) == 0
    tensors = manifest_of(dst)["tensors"]
    down = tensors["blk.0.ffn_down"]["ranks"]
    up = tensors["blk.0.ffn_up"]
    assert up["dim"] == "fused"
    assert [p["label"] for p in up["partitions"]] == ["gate", "up"]
    assert all(p["ranks"] == down for p in up["partitions"])  # the paired rule
    assert [b - a for a, b, _ in down] == ([256, 192] if tp == 2 else [128, 128, 128, 64])
    qkv = tensors["blk.0.attn_qkv"]
    assert [p["label"] for p in qkv["partitions"]] == ["q", "k", "v"]
    for rank in range(tp):
        f = GGUFFile(rank_checkpoint(dst, rank))
        try:
            a, b, _ = down[rank]
            assert f.value("phi3.feed_forward_length") == b - a
            got = np.array(f.array(f.tensors["blk.0.ffn_up.weight"]))
            want = np.concatenate(
                [raw["blk.0.ffn_up"][a:b], raw["blk.0.ffn_up"][inter + a : inter + b]]
            )
            np.testing.assert_array_equal(got, want, err_msg=f"ffn_up rank {rank}")
            got = np.array(f.array(f.tensors["blk.0.ffn_down.weight"]))
            np.testing.assert_array_equal(got, super_blocks(raw["blk.0.ffn_down"], a, b))
            offsets = (0, q_rows, q_rows + kv_rows)
            pieces = [
                raw["blk.0.attn_qkv"][o + p["ranks"][rank][0] : o + p["ranks"][rank][1]]
                for o, p in zip(offsets, qkv["partitions"], strict=True)
            ]
            got = np.array(f.array(f.tensors["blk.0.attn_qkv.weight"]))
            np.testing.assert_array_equal(got, np.concatenate(pieces), err_msg=f"qkv {rank}")
            q0, q1, _ = qkv["partitions"][0]["ranks"][rank]
            assert f.value("phi3.attention.head_count") == (q1 - q0) // head_dim
        finally:
            f.close()
    assert run("verify", str(src), str(dst)) == 0


def test_a_llama_cpp_moe_gguf_gives_each_rank_its_merged_experts(tmp_path: Path) -> None:
    # llama.cpp merges experts into blk.<i>.ffn_*_exps [E, N, K] with a .scale [E]: at
    # --tp 2 --ep 2 each rank's merged tensor is its experts' slice of the source's bytes
    # (cut by TP too) and its .scale their globals
    gguf = pytest.importorskip("gguf")
    from nvfp4_checkpoints.gguf.file import GGUFFile

    rng = np.random.default_rng(12)
    experts, hidden, inter = 5, 128, 256
    shapes = {
        "blk.0.ffn_gate_exps": (inter, hidden),
        "blk.0.ffn_up_exps": (inter, hidden),
        "blk.0.ffn_down_exps": (hidden, inter),
    }
    src = tmp_path / "moe.gguf"
    w = gguf.GGUFWriter(src, "qwen3moe")
    w.add_block_count(1)
    w.add_expert_count(experts)
    raw, scales = {}, {}
    for base, (n, k) in shapes.items():
        b = rng.integers(0, 256, (experts, n, k // 64, 36), dtype=np.uint8)
        b[..., :4] = rng.integers(0x08, 0x7F, (experts, n, k // 64, 4), dtype=np.uint8)
        raw[base] = b.reshape(experts, n, -1)
        scales[base] = rng.uniform(0.5, 2.0, experts).astype(np.float32)
        w.add_tensor(f"{base}.weight", raw[base], raw_dtype=gguf.GGMLQuantizationType.NVFP4)
        w.add_tensor(f"{base}.scale", scales[base])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "2", "--ep", "2") == 0
    manifest = manifest_of(dst)
    assert sorted(manifest["experts"]) == sorted(f"{b}.{{}}" for b in shapes)
    assert manifest["experts"]["blk.0.ffn_down_exps.{}"]["ranks"] == [[0, 3, 3], [3, 5, 2]]
    for rank in range(4):
        ep_rank, tp_rank = divmod(rank, 2)
        e0, e1, _ = manifest["experts"]["blk.0.ffn_down_exps.{}"]["ranks"][ep_rank]
        f = GGUFFile(rank_checkpoint(dst, rank))
        try:
            for base in shapes:
                a, b, _ = manifest["tensors"][f"{base}.0"]["ranks"][tp_rank]
                got = np.array(f.array(f.tensors[f"{base}.weight"]))
                want = raw[base][e0:e1]
                if base == "blk.0.ffn_down_exps":  # row-parallel: whole super-blocks of K
                    want = want[..., a // 64 * 36 : b // 64 * 36]
                else:  # gate / up: the down projection's K range as rows
                    want = want[:, a:b]
                np.testing.assert_array_equal(got, want, err_msg=f"{base} rank {rank}")
                scale = np.array(f.array(f.tensors[f"{base}.scale"]))
                np.testing.assert_array_equal(scale, scales[base][e0:e1])
        finally:
            f.close()
    assert run("verify", str(src), str(dst)) == 0
