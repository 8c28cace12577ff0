"""The whole-model engines: each loads our conversion of the T6 checkpoint in its own format
and runs its own generation.

An :class:`Engine` says which format our converter writes for it, which activation mode its
matmul computes in (so which reference tokens it is held to), the adapter whose kernels it
shares, and how to open a runner. A runner (:class:`Runner`) has ``greedy(prompt_ids, n)``:
the engine's own greedy generation, its tokens and the logits of every step, and
``teacher_forced(prompt_ids, ids)``: the logits predicting each of ``ids``. The engines are
imported only when a runner is opened.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["ENGINES", "Engine", "Runner"]

Logits = npt.NDArray[np.float32]


class Runner(Protocol):
    def greedy(self, prompt_ids: Sequence[int], n: int) -> tuple[list[int], Logits]: ...

    def teacher_forced(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> Logits: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Engine:
    """A whole-model engine: ``flavour`` (what ``nvfp4 convert --to`` writes for it),
    ``suffix`` (of the converted path), ``mode`` (the activation mode of its NVFP4 matmul:
    the golden tokens it is compared with), ``adapter`` (the nvfp4-engines adapter over the
    same engine's kernels), ``distributions`` (whose versions the results record) and
    ``open`` (a runner on a converted path)."""

    name: str
    flavour: str
    suffix: str
    mode: str
    adapter: str
    distributions: tuple[str, ...]
    open: Callable[[Path], Runner]
    settings: str

    def versions(self) -> dict[str, str]:
        out = {}
        for dist in self.distributions:
            try:
                out[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                out[dist] = "not installed"
        return out


#: llama.cpp's context: the longest golden prompt plus its 40 tokens fits many times over.
N_CTX = 512
N_THREADS = 2
SEED = 0


class LlamaCpp:
    """llama.cpp through llama-cpp-python: ``Llama(gguf, logits_all=True)``, greedy
    generation with ``Llama.generate(temp=0)`` (llama.cpp's greedy sampler), the logits of
    every position from ``Llama.scores``."""

    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        self.llm: Any = Llama(
            str(path),
            n_ctx=N_CTX,
            logits_all=True,
            seed=SEED,
            n_threads=N_THREADS,
            n_threads_batch=N_THREADS,
            verbose=False,
        )

    def greedy(self, prompt_ids: Sequence[int], n: int) -> tuple[list[int], Logits]:
        self.llm.reset()
        ids: list[int] = []
        for token in self.llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0):
            ids.append(int(token))
            if len(ids) == n:
                break
        start = len(prompt_ids) - 1  # the row whose logits chose the first new token
        logits = np.array(self.llm.scores[start : start + len(ids)], dtype=np.float32)
        return ids, logits

    def teacher_forced(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> Logits:
        self.llm.reset()
        self.llm.eval(list(prompt_ids) + list(ids)[:-1])
        start = len(prompt_ids) - 1
        return np.array(self.llm.scores[start : start + len(ids)], dtype=np.float32)

    def decode(self, ids: Sequence[int]) -> str:
        text: bytes = self.llm.detokenize(list(ids))
        return text.decode("utf-8", errors="replace")


class MlxLm:
    """mlx-lm: ``mlx_lm.load(folder, trust_remote_code=True)`` (the folder's
    ``nvfp4_mlx_lm.py``), greedy generation with ``mlx_lm.generate.generate_step`` and its
    default (greedy, argmax) sampler, which yields each token with the log probabilities it
    was chosen from; teacher-forced logits from one call of the model."""

    def __init__(self, path: Path) -> None:
        import mlx_lm

        loaded: Any = mlx_lm.load(str(path), trust_remote_code=True)
        self.model, self.tokenizer = loaded[0], loaded[1]

    def greedy(self, prompt_ids: Sequence[int], n: int) -> tuple[list[int], Logits]:
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        ids: list[int] = []
        steps = []
        for token, logprobs in generate_step(mx.array(list(prompt_ids)), self.model, max_tokens=n):
            ids.append(int(token))
            steps.append(np.array(logprobs.astype(mx.float32)))
        return ids, np.stack(steps).astype(np.float32)

    def teacher_forced(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> Logits:
        import mlx.core as mx

        logits = self.model(mx.array([list(prompt_ids) + list(ids)]))
        start = len(prompt_ids) - 1
        return np.array(logits[0, start : start + len(ids)].astype(mx.float32))

    def decode(self, ids: Sequence[int]) -> str:
        text: Any = self.tokenizer.decode(list(ids))
        return str(text)


ENGINES = {
    "llama.cpp": Engine(
        name="llama.cpp",
        flavour="gguf",
        suffix=".gguf",
        mode="w4a8",
        adapter="ggml",
        distributions=("llama-cpp-python",),
        open=LlamaCpp,
        settings=f"Llama(n_ctx={N_CTX}, logits_all=True, seed={SEED}, n_threads={N_THREADS}), "
        "generate(temp=0), CPU, default KV cache type",
    ),
    "mlx-lm": Engine(
        name="mlx-lm",
        flavour="mlx",
        suffix="",
        mode="w4a16",
        adapter="mlx-native",
        distributions=("mlx-lm", "mlx"),
        open=MlxLm,
        settings="mlx_lm.load(trust_remote_code=True), generate_step (greedy sampler), "
        "MLX's default device",
    ),
}
