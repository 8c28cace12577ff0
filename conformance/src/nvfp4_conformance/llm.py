"""Greedy decoding of a ModelOpt NVFP4 checkpoint with every NVFP4 linear on a backend.

This is the code path of ``python -m nvfp4_conformance generate`` and of tier T6:

1. :func:`load_model` opens the checkpoint with :func:`nvfp4_checkpoints.open_checkpoint`,
   builds the transformers causal LM its ``config.json`` describes (float32), loads the
   unquantized tensors (embeddings, norms, an untied ``lm_head``) and replaces the module
   at every quantized prefix with an :class:`NVFP4Linear` that calls ``backend.qmm`` on
   ``backend.prepare(planes)``;
2. :func:`greedy` decodes with a KV cache, batch 1, and keeps every step's logits;
3. :func:`teacher_forced_logits` scores a fixed token sequence (for the quality figures);
   :func:`activation_mode` switches every NVFP4 linear to a quantized activation mode
   (W4A4, W4A8) for the duration of a ``with`` block.

Requires the ``parity`` extra (torch, transformers).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "GreedyResult",
    "LoadedModel",
    "activation_mode",
    "greedy",
    "load_model",
    "margins",
    "teacher_forced_logits",
]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised on machines without torch
        raise RuntimeError(
            "NVFP4 greedy decoding needs torch and transformers: "
            "pip install 'nvfp4-conformance[parity]'"
        ) from exc
    return torch


@dataclass
class LoadedModel:
    """A causal LM whose NVFP4 linears run on ``backend``."""

    model: Any
    backend: Any
    quantized: list[str]
    config: dict[str, Any]
    #: backend products per forward pass (fewer than ``quantized`` when fused)
    products: int = 0


def load_model(
    checkpoint: str | os.PathLike[str], backend: Any, *, fuse: bool = False
) -> LoadedModel:
    """Build the float32 model of an NVFP4 checkpoint (any flavour nvfp4-checkpoints reads:
    ModelOpt, compressed-tensors, MLX folders, GGUF files) with its NVFP4 linears on
    ``backend`` (every quantized prefix must be a ``torch.nn.Linear`` of the model): the
    loading of :func:`nvfp4_checkpoints.torch_model.load_causal_lm`, with each linear an
    :class:`NVFP4Linear` calling ``backend.qmm`` on ``backend.prepare(planes)``. ``fuse``:
    q/k/v and gate/up share one product each
    (:func:`nvfp4_conformance.nvfp4_linear.attach_weights`); T6 certifies the unfused model,
    one backend call per checkpoint tensor."""
    _torch()
    from nvfp4_checkpoints import open_checkpoint
    from nvfp4_checkpoints.torch_model import load_causal_lm

    from .nvfp4_linear import NVFP4Linear, attach_weights

    planes_of: dict[str, Any] = {}
    modules: dict[str, NVFP4Linear] = {}

    def make(prefix: str, planes: Any, bias: Any, _input_scale: float | None) -> Any:
        planes_of[prefix] = planes
        modules[prefix] = NVFP4Linear(backend, None, planes.k, planes.n, bias, prefix)
        return modules[prefix]

    model = load_causal_lm(checkpoint, make=make, use_cache=True)
    products = attach_weights(modules, planes_of, backend, fuse=fuse)
    with open_checkpoint(Path(checkpoint)) as ckpt:
        raw_config = dict(ckpt.config)
        quantized = list(ckpt.quantized_names())
    return LoadedModel(model, backend, quantized, raw_config, products)


@dataclass
class GreedyResult:
    """``new_ids`` and the float32 logits ``[steps, vocab]`` each was chosen from, with the
    wall time of the prompt's forward pass (``prefill_seconds``, which chose the first
    token) and of the forward passes that chose the others (``decode_seconds``)."""

    new_ids: list[int]
    logits: npt.NDArray[np.float32]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


#: torch threads during greedy decoding: one. At batch 1 torch's own operations (attention,
#: norms, rotary embeddings, a float lm_head) are too small to split, and its idle OpenMP
#: threads spin for the cores the backend's kernels run on: on a busy 2-core machine, with
#: torch on 2 threads, attention took 11 ms a call instead of 0.04 ms and a step of SmolLM2
#: 0.46 s instead of 0.10 s.
DECODE_TORCH_THREADS = 1


def _cache_argument(model: Any) -> str:
    """The name of the KV-cache argument and output field: ``cache`` (transformers >= 5.2x)
    or ``past_key_values`` (earlier releases)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def greedy(
    model: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    stop_ids: Collection[int] = (),
    on_token: Callable[[int], None] | None = None,
    torch_threads: int | None = DECODE_TORCH_THREADS,
    lean: Any = None,
) -> GreedyResult:
    """Greedy decoding, batch 1, with the model's KV cache: ``max_new_tokens`` steps, or
    fewer when a token of ``stop_ids`` is chosen (it is kept; T6 gives none, so
    end-of-sequence tokens do not stop it). Ties pick the lowest token id. ``on_token`` is
    called with each token as it is chosen. torch's own operations run on ``torch_threads``
    threads for the duration (``None``: as they are); see :data:`DECODE_TORCH_THREADS`.
    ``lean``: a :class:`nvfp4_conformance.lean_decoder.LeanDecoder` of ``model`` to run
    instead of the transformers forward (its cache must hold the prompt and the new
    tokens)."""
    torch = _torch()
    if not prompt_ids:
        raise ValueError("greedy: the prompt needs at least one token")
    if lean is not None and len(prompt_ids) + max_new_tokens > lean.capacity:
        raise ValueError(
            f"greedy: {len(prompt_ids)} prompt and {max_new_tokens} new tokens exceed the "
            f"lean decoder's cache of {lean.capacity} positions"
        )
    cache_arg = _cache_argument(model)
    keep = (
        {"logits_to_keep": 1}
        if "logits_to_keep" in inspect.signature(model.forward).parameters
        else {}
    )
    stop = frozenset(stop_ids)
    threads_before = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        step = (
            _transformers_steps(torch, model, cache_arg, keep)
            if lean is None
            else _lean_steps(lean)
        )
        return _greedy_loop(torch, step, prompt_ids, max_new_tokens, stop, on_token)
    finally:
        torch.set_num_threads(threads_before)


def _transformers_steps(
    torch: Any, model: Any, cache_arg: str, keep: dict[str, Any]
) -> Callable[[Sequence[int]], Any]:
    """A step function on the transformers forward: the prompt's ids first, then one token
    at a time; each call returns the last position's logits and keeps the KV cache."""
    state: dict[str, Any] = {}

    def step(ids: Sequence[int]) -> Any:
        cache = {cache_arg: getattr(state["out"], cache_arg)} if state else {}
        state["out"] = model(
            input_ids=torch.tensor([list(ids)], dtype=torch.long),
            use_cache=True,
            **keep,
            **cache,
        )
        return state["out"].logits[0, -1]

    return step


def _lean_steps(lean: Any) -> Callable[[Sequence[int]], Any]:
    """The same on a lean decoder (its cache emptied first)."""
    lean.reset()
    return lambda ids: lean.forward(list(ids))


def _greedy_loop(
    torch: Any,
    step: Callable[[Sequence[int]], Any],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop: frozenset[int],
    on_token: Callable[[int], None] | None,
) -> GreedyResult:
    """:func:`greedy`'s loop, its arguments checked, on a step function."""
    new: list[int] = []
    steps: list[npt.NDArray[np.float32]] = []
    with torch.no_grad():
        start = time.perf_counter()
        logits_t = step(prompt_ids)
        prefill = time.perf_counter() - start
        for i in range(max_new_tokens):
            logits = logits_t.to(torch.float32).numpy().copy()
            steps.append(logits)
            token = int(np.argmax(logits))
            new.append(token)
            if on_token is not None:
                on_token(token)
            if i + 1 == max_new_tokens or token in stop:
                break
            logits_t = step([token])
    decode = time.perf_counter() - start - prefill
    logits_all = np.stack(steps) if steps else np.zeros((0, logits_t.shape[-1]), np.float32)
    return GreedyResult(new, logits_all, prefill_seconds=prefill, decode_seconds=decode)


def teacher_forced_logits(
    model: Any, prompt_ids: Sequence[int], new_ids: Sequence[int]
) -> npt.NDArray[np.float32]:
    """Logits ``[len(new_ids), vocab]`` predicting each of ``new_ids`` from the prompt and
    the tokens before it (one forward pass)."""
    torch = _torch()
    ids = list(prompt_ids) + list(new_ids)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    start = len(prompt_ids) - 1
    logits: npt.NDArray[np.float32] = (
        out.logits[0, start : start + len(new_ids)].to(torch.float32).numpy()
    )
    return logits.copy()


@contextmanager
def activation_mode(model: Any, mode: str) -> Iterator[int]:
    """Within the block, every NVFP4 linear of ``model`` computes its product in activation
    mode ``mode`` (see :data:`nvfp4_conformance.nvfp4_linear.ACTIVATION_VERBS`); yields how
    many linears were switched, and restores each one's mode on exit."""
    from .nvfp4_linear import NVFP4Linear

    linears = [m for m in model.modules() if isinstance(m, NVFP4Linear)]
    before = [m.activations for m in linears]
    try:
        for m in linears:
            m.activations = mode
        yield len(linears)
    finally:
        for m, old in zip(linears, before, strict=True):
            m.activations = old


def margins(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Top-1 minus top-2 logit of every step."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]).astype(np.float32)
