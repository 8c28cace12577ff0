"""A lean batch-1 forward for Llama-family decoders whose linears are NVFP4 on a backend.

``generate`` decodes with it: at batch 1 the transformers forward spends more time in its
own machinery (masks, cache objects, keyword plumbing: about 0.55 ms a layer on a 2-core
EPYC) than the backend spends in the NVFP4 products. :class:`LeanDecoder` runs the same
mathematics with a handful of torch operations a layer, on the modules and weights of the
transformers model :func:`nvfp4_torch.loader.load_model` built:

* the token embedding, RMSNorm (``w * (x * rsqrt(mean(x^2) + eps))``, as transformers),
  rotary embeddings from a cos / sin table computed once by transformers' own formula
  (``cat(p * inv_freq, p * inv_freq)``), scaled dot-product attention with grouped KV heads
  over a preallocated cache, ``silu(gate) * up`` and the residual adds;
* the products through the model's :class:`~nvfp4_torch.modules.NVFP4Linear`
  modules (so a fused q/k/v or gate/up product is computed once per input, and the backend
  sees exactly the calls the transformers forward makes);
* the float32 ``lm_head`` on the last position only, its rows split between
  :data:`HEAD_WORKERS` threads (each a ``torch.mm`` on one thread: the 113 MB of SmolLM2's
  tied head are read at both cores' bandwidth without waking torch's OpenMP pool, whose
  spinning threads would take the cores from the backend's kernels).

The same forward runs tensor-parallel: :class:`nvfp4_torch.parallel_decoder.ParallelDecoder`
is a subclass that replaces where the pieces come from (each rank's shards of the linears,
its heads, its rows of the ``lm_head`` and the gather of the logits: the ``_local_heads``,
``_attention_linears``, ``_mlp_linears``, ``_bind_layers``, ``_head_rows``,
``_head_module`` and ``_gather_logits`` hooks) and nothing of the arithmetic; at one rank it
is this decoder, bit for bit. An NVFP4 ``lm_head`` is called as its module.

Tier T6 certifies backends on the transformers forward (an implementation nobody here
wrote); the tests hold this one to it: the same greedy tokens on the golden prompts, logits
within float32 summation-order differences (:func:`nvfp4_torch.decode.greedy` takes
either). Architectures it does not cover (:func:`unsupported`) keep the transformers
forward.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .modules import ACTIVATION_VERBS

__all__ = ["HEAD_WORKERS", "LeanDecoder", "unsupported"]

#: Threads that share the float32 ``lm_head`` (rows split evenly).
HEAD_WORKERS = 2

#: transformers model types whose decoder layer is Llama's: pre-norm RMSNorm, rotary
#: attention with grouped KV heads, a gated SiLU MLP (optional q/k/v biases are the
#: linears' own).
LLAMA_LIKE = ("llama", "mistral", "qwen2")


def unsupported(model: Any) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (a transformers causal LM), or None."""
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    if kind not in LLAMA_LIKE:
        return f"model type {kind!r} (covered: {', '.join(LLAMA_LIKE)})"
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        return f"hidden_act {act!r} (covered: 'silu')"
    window = getattr(cfg, "sliding_window", None)
    if kind != "llama" and window is not None and getattr(cfg, "use_sliding_window", True):
        return f"sliding-window attention (window {window})"
    rotary = getattr(model.model, "rotary_emb", None)
    rope = getattr(rotary, "rope_type", "default")
    if rotary is None or rope != "default":
        return f"rope type {rope!r} (covered: 'default')"
    return None


@dataclass
class _Layer:
    """One decoder layer's pieces."""

    norm1: torch.Tensor
    eps1: float
    q: Any
    k: Any
    v: Any
    o: Any
    norm2: torch.Tensor
    eps2: float
    gate: Any
    up: Any
    down: Any


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm on float32 ``x``."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
    cat(-x2, x1)``: the sign is in ``signed_sin = cat(-sin1, sin2)`` (``-a * b`` and
    ``a * -b`` are the same float), one operation fewer."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * signed_sin


def _project(linears: tuple[Any, ...], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs ``[t, n]`` of sibling linears on one input ``x [t, K]``: one backend call
    when they are NVFP4 linears sharing a fused product (each output a column view of it),
    else each module called (an unquantized ``torch.nn.Linear`` of a mixed checkpoint
    too); each in the linear's activation mode, with its bias."""
    shared = [getattr(m, "shared", None) for m in linears]  # None: unfused, or not NVFP4
    product = shared[0]
    if product is None or any(s is None or s[0] is not product[0] for s in shared):
        return [m(x) for m in linears]
    verb = ACTIVATION_VERBS[linears[0].activations]
    if any(ACTIVATION_VERBS[m.activations] != verb for m in linears):
        return [m(x) for m in linears]
    y = torch.from_numpy(product[0].output(x, verb))
    outs = []
    for m in linears:
        _, lo, hi = m.shared
        part = y[:, lo:hi]
        outs.append(part if m.bias is None else part + m.bias)
    return outs


class LeanDecoder:
    """Greedy-decoding forward of a Llama-family transformers model (see the module
    docstring); ``capacity`` positions of KV cache. Call :meth:`reset` before a new
    sequence, then :meth:`forward` with the prompt's ids and with each new token."""

    def __init__(self, model: Any, capacity: int) -> None:
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"{type(self).__name__}: unsupported model: {why}")
        if capacity < 1:
            raise ValueError(f"{type(self).__name__}: capacity: expected >= 1, found {capacity}")
        cfg = model.config
        inner = model.model
        #: the model's attention heads, query and KV (:attr:`heads` / :attr:`kv_heads` are
        #: the ones this decoder computes: all of them here, a rank's under tensor parallelism)
        self.model_heads = int(cfg.num_attention_heads)
        self.model_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.model_heads)
        self.head_dim = int(
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        )
        self.heads, self.kv_heads, self.kv_index = self._local_heads()
        self.scale = self.head_dim**-0.5
        self.capacity = capacity
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.norm_eps = float(inner.norm.variance_epsilon)
        self.layers = [
            _Layer(
                layer.input_layernorm.weight.detach(),
                float(layer.input_layernorm.variance_epsilon),
                *self._attention_linears(f"model.layers.{i}.self_attn", layer.self_attn),
                layer.post_attention_layernorm.weight.detach(),
                float(layer.post_attention_layernorm.variance_epsilon),
                *self._mlp_linears(f"model.layers.{i}.mlp", layer.mlp),
            )
            for i, layer in enumerate(inner.layers)
        ]
        self._bind_layers()
        # Rotary table by transformers' formula: angle = position * inv_freq, each
        # frequency used for the two halves of the head dimension.
        rotary = inner.rotary_emb
        positions = torch.arange(capacity, dtype=torch.float32)[:, None]
        freqs = positions * rotary.inv_freq.to(torch.float32)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)  # [capacity, head_dim]
        self.cos = angles.cos() * rotary.attention_scaling
        sin = angles.sin() * rotary.attention_scaling
        half = self.head_dim // 2
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        shape = (len(self.layers), self.kv_heads, capacity, self.head_dim)
        self.keys = torch.zeros(shape, dtype=torch.float32)
        self.values = torch.zeros(shape, dtype=torch.float32)
        self.length = 0
        #: wall time inside the lm_head since construction (for profiles)
        self.head_seconds = 0.0
        head = model.get_output_embeddings()
        self.vocab = int(head.out_features)
        #: a float ``lm_head``'s rows this decoder computes ``[lo, hi)`` (all of them here)
        self.head_rows = self._head_rows()
        self.head: Any = None  # the float rows [lo, hi), or None when the head is a module
        self.head_bias: torch.Tensor | None = None
        self.head_module: Any = None
        if isinstance(head, torch.nn.Linear):
            lo, hi = self.head_rows
            self.head = head.weight.detach()[lo:hi]
            self.head_bias = None if head.bias is None else head.bias.detach()[lo:hi]
        else:  # an NVFP4 lm_head
            self.head_module = self._head_module(head)
        rows = self.head_rows[1] - self.head_rows[0]
        bounds = [rows * i // HEAD_WORKERS for i in range(HEAD_WORKERS + 1)]
        self._head_parts = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]

    # -- what a tensor-parallel subclass replaces (nvfp4_torch.parallel_decoder) -----------

    def _local_heads(self) -> tuple[int, int, torch.Tensor | None]:
        """``(query heads, KV heads, kv_index)`` this decoder computes; ``kv_index`` maps
        each query head to its KV head where grouped attention's uniform rule (query head
        ``j`` reads KV head ``j // group``) does not, else None."""
        return self.model_heads, self.model_kv_heads, None

    def _attention_linears(self, prefix: str, attn: Any) -> tuple[Any, Any, Any, Any]:
        """q, k, v and o of one layer (the model's modules)."""
        return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj

    def _mlp_linears(self, prefix: str, mlp: Any) -> tuple[Any, Any, Any]:
        """gate, up and down of one layer (the model's modules)."""
        return mlp.gate_proj, mlp.up_proj, mlp.down_proj

    def _bind_layers(self) -> None:
        """Bind the layers' linears to a backend (the model's are bound already)."""

    def _head_rows(self) -> tuple[int, int]:
        """The vocabulary rows ``[lo, hi)`` of the logits this decoder computes itself."""
        return 0, self.vocab

    def _head_module(self, head: Any) -> Any:
        """The module that computes the logits when the ``lm_head`` is not a float
        ``torch.nn.Linear`` (an NVFP4 one): the model's."""
        return head

    def _gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """The logits ``[1, vocab]`` from this decoder's rows (all of them here)."""
        return local

    def reset(self) -> None:
        """Forget the cached sequence."""
        self.length = 0

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        """Run ``ids`` (the prompt, or one new token) after the cached positions; the float32
        logits ``[vocab]`` of the last position."""
        t = len(ids)
        start = self.length
        if t < 1:
            raise ValueError("LeanDecoder.forward: expected at least one token")
        if start + t > self.capacity:
            raise ValueError(
                f"LeanDecoder.forward: {start + t} positions exceed the cache's {self.capacity}"
            )
        if start > 0 and t > 1:
            raise ValueError("LeanDecoder.forward: several tokens only for the prompt")
        end = start + t
        h = self.embed[torch.tensor(list(ids), dtype=torch.long)]  # [t, hidden]
        cos, sin = self.cos[start:end], self.signed_sin[start:end]  # [t, head_dim]
        gqa = self.kv_index is None and self.heads != self.kv_heads
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.norm1, layer.eps1)
            q, k, v = _project((layer.q, layer.k, layer.v), x)
            # [t, heads * head_dim] -> [heads, t, head_dim] (views of the product)
            q = q.view(t, self.heads, self.head_dim).transpose(0, 1)
            k = k.view(t, self.kv_heads, self.head_dim).transpose(0, 1)
            v = v.view(t, self.kv_heads, self.head_dim).transpose(0, 1)
            self.keys[i, :, start:end] = _rotate(k, cos, sin)
            self.values[i, :, start:end] = v
            keys, values = self.keys[i, :, :end], self.values[i, :, :end]
            if self.kv_index is not None:  # a rank's KV heads not in uniform groups
                keys, values = keys[self.kv_index], values[self.kv_index]
            # Query heads g*j .. g*j+g-1 read KV head j (enable_gqa: no copies).
            attn = F.scaled_dot_product_attention(
                _rotate(q, cos, sin)[None],
                keys[None],  # [1, kv_heads, end, head_dim], a view
                values[None],
                is_causal=t > 1,
                scale=self.scale,
                enable_gqa=gqa,
            )[0]  # [heads, t, head_dim]
            (o,) = _project((layer.o,), attn.transpose(0, 1).reshape(t, -1))
            h = h + o
            x = _rms_norm(h, layer.norm2, layer.eps2)
            gate, up = _project((layer.gate, layer.up), x)
            (down,) = _project((layer.down,), F.silu(gate) * up)
            h = h + down
        self.length = end
        last = _rms_norm(h[-1:], self.norm, self.norm_eps)  # [1, hidden]
        t0 = time.perf_counter()
        logits = self._logits(last)[0]
        self.head_seconds += time.perf_counter() - t0
        return logits

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``[1, vocab]`` of ``x [1, hidden]``: ``x @ head.T (+ bias)`` over
        this decoder's rows, in :data:`HEAD_WORKERS` threads, then gathered
        (:meth:`_gather_logits`); an NVFP4 ``lm_head`` is its module's product."""
        if self.head_module is not None:
            (y,) = _project((self.head_module,), x)
            return y.to(torch.float32)
        rows = self.head_rows[1] - self.head_rows[0]
        out = torch.empty((1, rows), dtype=torch.float32)

        def part(lo: int, hi: int) -> None:
            torch.mm(x, self.head[lo:hi].t(), out=out[:, lo:hi])

        if len(self._head_parts) == 1:
            part(*self._head_parts[0])
        else:
            workers = [
                threading.Thread(target=part, args=bounds) for bounds in self._head_parts[1:]
            ]
            for w in workers:
                w.start()
            part(*self._head_parts[0])
            for w in workers:
                w.join()
        if self.head_bias is not None:
            out += self.head_bias
        return self._gather_logits(out)
