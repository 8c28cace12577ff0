"""Build tiny NVFP4 checkpoints with NVIDIA ModelOpt itself, on the CPU.

The checkpoint tests read real ModelOpt exports rather than files written by our own code.
This script makes them in a few seconds:

* ``llama``: a ``LlamaForCausalLM`` (hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV
  heads, vocab 256), float32, quantized with ``mtq.NVFP4_DEFAULT_CFG`` (W4A4: every linear
  layer but ``lm_head`` gets ``weight``/``weight_scale``/``weight_scale_2``/``input_scale``);
* ``moe``: a ``Qwen3MoeForCausalLM`` (4 experts, 2 per token, expert width 64), bfloat16,
  same config: per-expert tensors ``mlp.experts.<i>.{gate,up,down}_proj.*``, the routers
  ``mlp.gate`` left unquantized;
* ``mixed``: the Llama in bfloat16 with the MLP input quantizers disabled, which ModelOpt
  exports as ``MIXED_PRECISION`` (attention ``NVFP4``, MLP ``W4A16_NVFP4``) with per-layer
  ``quantized_layers``.

Each model is initialised from a fixed seed, calibrated on two random token batches
(``mtq.quantize(model, cfg, forward_loop)`` with the ``max`` algorithm) and exported with
``modelopt.torch.export.export_hf_checkpoint``. On the CPU this works as it is: ModelOpt's
NVFP4 fake-quant falls back to its pure-torch path when CUDA/Triton are absent, so no
workaround was needed (checked with nvidia-modelopt 0.47, torch 2.13 CPU, transformers 5).

Usage: ``python make_modelopt_exports.py OUT_DIR`` (or :func:`exports` from the tests,
which builds once per directory and reuses a complete build).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
from pathlib import Path
from typing import Any

NAMES = ("llama", "moe", "mixed")
SEED = 1234
_COMPLETE = ".complete"
#: The dimensions both tiny models share (the Llama's whole config).
_TINY_DECODER: dict[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _calibrate(model: Any, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(0, vocab, (2, 16), generator=g))


def _llama(dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(**_TINY_DECODER)
    model = LlamaForCausalLM(cfg).eval().to(dtype)
    model.config.architectures = ["LlamaForCausalLM"]
    return model


def _moe() -> Any:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED + 1)
    cfg = Qwen3MoeConfig(
        **_TINY_DECODER,
        moe_intermediate_size=64,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
    )
    model = Qwen3MoeForCausalLM(cfg).eval().to(torch.bfloat16)
    model.config.architectures = ["Qwen3MoeForCausalLM"]
    return model


def build_one(name: str, out: Path) -> Path:
    """Build, quantize and export model ``name`` into ``out`` (which must not exist)."""
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    if name == "llama":
        model = _llama(torch.float32)
    elif name == "moe":
        model = _moe()
    elif name == "mixed":
        model = _llama(torch.bfloat16)
        # quant_cfg is a list of rules in ModelOpt 0.47; later rules win.
        cfg["quant_cfg"].append({"quantizer_name": "*mlp*input_quantizer", "enable": False})
    else:
        raise ValueError(f"unknown model {name!r}; one of {NAMES}")
    mtq.quantize(model, cfg, lambda m: _calibrate(m, SEED + 2))
    export_hf_checkpoint(model, export_dir=str(out))
    return out


def exports(base: Path, names: tuple[str, ...] = NAMES) -> dict[str, Path]:
    """``{name: export dir}`` under ``base``, building what is missing (once: a finished
    build leaves a marker; an unfinished one is rebuilt)."""
    base.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        d = base / name
        if not (d / _COMPLETE).is_file():
            shutil.rmtree(d, ignore_errors=True)
            tmp = base / f".{name}.building.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build_one(name, tmp)
            os.rename(tmp, d)
            (d / _COMPLETE).write_text("ok\n")
        out[name] = d
    return out


def session_exports(tmp_path_factory: Any) -> dict[str, Path]:
    """For a session-scoped pytest fixture: the exports under the session's base temp dir
    (built by the first test module that asks, reused by the others). Skips when
    nvidia-modelopt or transformers is missing."""
    import pytest

    pytest.importorskip("modelopt.torch.quantization")
    pytest.importorskip("transformers")
    return exports(Path(tmp_path_factory.getbasetemp()) / "modelopt_exports")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--only", choices=NAMES, action="append")
    args = p.parse_args(argv)
    for name, path in exports(args.out_dir, tuple(args.only or NAMES)).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
