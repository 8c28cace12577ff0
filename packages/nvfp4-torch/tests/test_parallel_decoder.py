"""The tensor-parallel decoder against the one-process lean decoder, on real gloo ranks
(one spawn of 3 processes: world sizes 1, 2 and 3) and on a torchrun launch of
``python -m nvfp4_torch generate`` at 2 processes.

A tiny Qwen2 (4 query heads, 2 KV heads, q/k/v biases, tied head; every decoder linear
NVFP4) at TP2 splits by KV groups and at TP3 by query heads with replicated KV heads (the
``kv_index`` path); at world 1 the decoder must be the lean decoder bit for bit, at 2 and 3
the same tokens with logits within float32 summation-order differences, far below the
smallest top-1 / top-2 margin of the run (so the token comparison is not a coin toss)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from nvfp4.shard_plan import head_plan
from nvfp4_torch.testing import tiny_model

pytest.importorskip("transformers")

PROMPTS = [[1, 5, 9, 2, 17, 4], [3, 3, 8]]
NEW = 12
WORLDS = (1, 2, 3)


@pytest.fixture(scope="module")
def qwen2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nvfp4_torch import smollm2

    q = smollm2.quantize_model(tiny_model("qwen2", seed=11))
    return smollm2.write_nvfp4_checkpoint(q, tmp_path_factory.mktemp("tp") / "qwen2")


@pytest.fixture(scope="module")
def one_process(qwen2_checkpoint: Path) -> list[Any]:
    """The lean decoder's greedy runs (fused q/k/v and gate/up, the reference backend)."""
    import nvfp4
    from nvfp4_torch import decode, loader
    from nvfp4_torch.lean_decoder import LeanDecoder

    loaded = loader.load_model(qwen2_checkpoint, nvfp4.get_backend("reference"), fuse=True)
    lean = LeanDecoder(loaded.model, max(map(len, PROMPTS)) + NEW)
    return [decode.greedy(loaded.model, p, NEW, lean=lean) for p in PROMPTS]


@pytest.fixture(scope="module")
def ranked(qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    from nvfp4_torch.parallel_greedy import greedy_on_ranks

    folder = tmp_path_factory.mktemp("ranks")
    return greedy_on_ranks(qwen2_checkpoint, "reference", PROMPTS, NEW, WORLDS, folder, fuse=True)


def test_world_1_is_the_lean_decoder_bit_for_bit(ranked: dict[int, Any], one_process: Any) -> None:
    run = ranked[1]
    for i, want in enumerate(one_process):
        assert run.new_ids[i] == want.new_ids
        np.testing.assert_array_equal(run.logits[i], want.logits)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_decoding_gives_the_same_tokens(
    ranked: dict[int, Any], one_process: Any, world: int
) -> None:
    from nvfp4_torch.parity import margins

    run = ranked[world]
    assert run.ranks_agree, f"TP{world}: the ranks chose different tokens"
    smallest = min(float(margins(w.logits).min()) for w in one_process)
    for i, want in enumerate(one_process):
        assert run.new_ids[i] == want.new_ids, f"TP{world} prompt {i}"
        diff = float(np.abs(run.logits[i] - want.logits).max())
        scale = float(np.abs(want.logits).max())
        # the partial sums are added in another order: float32 rounding, no more
        assert diff <= 1e-5 * scale, f"TP{world} prompt {i}: logits differ by {diff}"
        assert diff < smallest / 100, (diff, smallest)
    assert run.shard_seconds > 0
    assert all(s > 0 for s in run.decode_seconds)


def test_local_heads_of_replicated_kv_heads() -> None:
    """8 query heads over 2 KV heads at TP3: rank 1 holds heads 3, 4, 5, reading KV heads
    0, 1, 1, which no uniform grouping gives: an explicit map. SmolLM2's 9 / 3 heads at TP2
    and TP3 group uniformly."""
    from nvfp4_torch.parallel_decoder import local_heads

    heads, kv, index = local_heads(head_plan(8, 2, 16, 3), 1)
    assert (heads, kv) == (3, 2)
    assert index is not None
    assert index.tolist() == [0, 1, 1]
    assert local_heads(head_plan(9, 3, 64, 2), 0) == (6, 2, None)
    assert local_heads(head_plan(9, 3, 64, 2), 1) == (3, 1, None)
    assert local_heads(head_plan(9, 3, 64, 3), 2) == (3, 1, None)


def test_a_float_decoder_linear_is_refused(qwen2_checkpoint: Path) -> None:
    import nvfp4
    from nvfp4_torch import loader
    from nvfp4_torch.parallel_decoder import ParallelDecoder, unsupported_parallel

    model = loader.load_model(qwen2_checkpoint, nvfp4.get_backend("reference"), bind=False).model
    assert unsupported_parallel(model) is None
    model.model.layers[1].mlp.up_proj = torch.nn.Linear(64, 128, bias=False)
    why = unsupported_parallel(model)
    assert why is not None
    assert "layer 1 up_proj is a Linear" in why
    with pytest.raises(ValueError, match="unsupported model: layer 1 up_proj"):
        ParallelDecoder(model, 8, nvfp4.get_backend("reference"))


def test_without_a_process_group_the_decoder_says_how_to_start_one(
    qwen2_checkpoint: Path,
) -> None:
    import nvfp4
    from nvfp4_torch import loader
    from nvfp4_torch.parallel_decoder import ParallelDecoder

    model = loader.load_model(qwen2_checkpoint, nvfp4.get_backend("reference"), bind=False).model
    with pytest.raises(RuntimeError, match="torchrun"):
        ParallelDecoder(model, 8, nvfp4.get_backend("reference"))


def _torchrun_generate(checkpoint: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2 -m nvfp4_torch generate`` of
    ``PROMPTS[0]`` on the reference backend."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None, "torch installs the torchrun command beside python"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NVFP4_CPU_THREADS": "1"}
    cmd = [
        torchrun,
        "--standalone",  # one machine, a free port
        "--nproc-per-node",
        "2",
        "-m",
        "nvfp4_torch",
        "generate",
        "--checkpoint",
        str(checkpoint),
        "--backend",
        "reference",
        "--prompt-ids",
        ",".join(map(str, PROMPTS[0])),
        "--max-new-tokens",
        str(NEW),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_torchrun_generate_at_two_processes(
    qwen2_checkpoint: Path, one_process: Any, tmp_path: Path
) -> None:
    """``torchrun --nproc-per-node 2 -m nvfp4_torch generate --prompt-ids ...`` prints the
    one-process tokens once (rank 0), and the summary names the tensor-parallel forward."""
    done = _torchrun_generate(qwen2_checkpoint, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1, done.stdout  # rank 1 is quiet
    assert json.loads(printed[0])["new_ids"] == one_process[0].new_ids
    assert "tensor parallel: 2 ranks, gloo" in done.stderr


def test_a_failing_rank_is_heard(tmp_path: Path) -> None:
    """A checkpoint that cannot be read: every rank fails; rank 0 says why as a one-process
    run does, and rank 1, quiet otherwise, says it too, with its rank."""
    done = _torchrun_generate(tmp_path / "absent", tmp_path)
    assert done.returncode != 0
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert any(line.startswith("generate: ") and "absent" in line for line in lines), lines
    assert any(line.startswith("rank 1: generate: ") and "absent" in line for line in lines)


def test_tensor_parallel_generate_refuses_the_transformers_forward(
    qwen2_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from nvfp4_torch import __main__

    monkeypatch.setenv("WORLD_SIZE", "2")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    argv = ["generate", "--checkpoint", str(qwen2_checkpoint), "--prompt-ids", "1,2"]
    assert __main__.main([*argv, "--forward", "transformers"]) == 2
    assert "--forward transformers" in err.getvalue()
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert __main__.main(argv) == 2
    assert "WORLD_SIZE: expected an integer, found 'two'" in err.getvalue()


def test_an_nvfp4_lm_head(tmp_path: Path) -> None:
    """An NVFP4 ``lm_head`` (untied): the lean decoder calls it as a module and gives the
    transformers forward's logits bit for bit; the tensor-parallel decoder cuts it by
    vocabulary rows (a column-parallel layer, gathered) and, on a one-rank gloo group,
    gives the lean decoder's logits bit for bit."""
    import socket

    import nvfp4
    import torch.distributed as dist
    from nvfp4_torch import decode, loader, smollm2
    from nvfp4_torch.lean_decoder import LeanDecoder
    from nvfp4_torch.modules import NVFP4Linear
    from nvfp4_torch.parallel_decoder import ParallelDecoder

    model = tiny_model("qwen2", seed=5)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    q = smollm2.quantize_model(model)
    q.planes["lm_head"] = nvfp4.quantize(q.tensors.pop("lm_head.weight"), name="lm_head")
    ckpt = smollm2.write_nvfp4_checkpoint(q, tmp_path / "nvfp4-head")
    backend = nvfp4.get_backend("reference")
    loaded = loader.load_model(ckpt, backend, fuse=True)
    assert isinstance(loaded.model.lm_head, NVFP4Linear)
    prompt, capacity = PROMPTS[0], len(PROMPTS[0]) + 8
    want = decode.greedy(loaded.model, prompt, 8)
    lean = decode.greedy(loaded.model, prompt, 8, lean=LeanDecoder(loaded.model, capacity))
    assert lean.new_ids == want.new_ids
    np.testing.assert_array_equal(lean.logits, want.logits)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        decoder = ParallelDecoder(loaded.model, capacity, backend, fuse=True)
        assert decoder.head_module is not None
        sharded = decode.greedy(loaded.model, prompt, 8, lean=decoder)
    finally:
        dist.destroy_process_group()
    assert sharded.new_ids == lean.new_ids
    np.testing.assert_array_equal(sharded.logits, lean.logits)
