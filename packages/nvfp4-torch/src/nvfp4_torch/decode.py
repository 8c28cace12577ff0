"""Greedy decoding and teacher-forced scoring of a causal LM whose linears are NVFP4.

* :func:`greedy` decodes with a KV cache, batch 1, and keeps every step's logits (on the
  transformers forward, or on a :class:`nvfp4_torch.lean_decoder.LeanDecoder`);
* :func:`teacher_forced_logits` scores a fixed token sequence (for quality figures);
* :func:`activation_mode` switches every NVFP4 linear to a quantized activation mode
  (W4A4, W4A8) for the duration of a ``with`` block;

The model usually comes from :func:`nvfp4_torch.loader.load_model`. This is the code path of
``python -m nvfp4_torch generate`` and of tier T6 of the conformance suite.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .modules import NVFP4Linear

__all__ = [
    "DECODE_TORCH_THREADS",
    "GreedyResult",
    "activation_mode",
    "greedy",
    "teacher_forced_logits",
]


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
    ``lean``: a :class:`nvfp4_torch.lean_decoder.LeanDecoder` of ``model`` to run
    instead of the transformers forward (its cache must hold the prompt and the new
    tokens)."""
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
    mode ``mode`` (see :data:`nvfp4_torch.modules.ACTIVATION_VERBS`); yields how
    many linears were switched, and restores each one's mode on exit."""
    linears = [m for m in model.modules() if isinstance(m, NVFP4Linear)]
    before = [m.activations for m in linears]
    try:
        for m in linears:
            m.activations = mode
        yield len(linears)
    finally:
        for m, old in zip(linears, before, strict=True):
            m.activations = old
