"""Tensor-parallel greedy decoding: :class:`ParallelDecoder` is the lean batch-1 decoder
(:class:`nvfp4_torch.lean_decoder.LeanDecoder`, the same forward code) run on every rank
of a ``torch.distributed`` group, each rank holding its shard of every NVFP4 linear, cut by
the shard plan of spec 1.2, section "Sharding" (:mod:`nvfp4.shard_plan`):

* q / k / v column-parallel by whole heads (:func:`nvfp4.shard_plan.head_plan`: by KV groups
  when there are at least as many KV heads as ranks, else by query heads with the KV heads
  they read replicated), o_proj row-parallel on the same heads (the paired rule);
* gate / up column-parallel by down_proj's K plan (:func:`nvfp4.shard_plan.paired_plan`),
  down_proj row-parallel;
* row-parallel partials kept in float32 and summed in float32
  (:class:`nvfp4_torch.parallel.RowParallelLinear`), then the residual add;
* the ``lm_head`` column-parallel over the vocabulary (a float head: each rank multiplies
  its rows; an NVFP4 head: :class:`~nvfp4_torch.parallel.ColumnParallelLinear`), the logits
  gathered (no arithmetic); embeddings and norms replicated.

Every rank ends a step with the same logits (an all-reduce and a gather give every rank the
same values), so every rank makes the same greedy choice without another collective. At
world size 1 the plans cut nothing and the decoder computes what :class:`LeanDecoder` does,
bit for bit (tested).

Each rank loads the whole checkpoint (:func:`nvfp4_torch.loader.load_causal_lm`, linears
unbound) and prepares only its shards on the backend.
"""

from __future__ import annotations

from typing import Any

import torch
from nvfp4.shard_plan import HeadPlan, ShardPlan, head_plan, paired_plan, shard_plan

from .collectives import all_gather_last, rank_and_world
from .lean_decoder import LeanDecoder, unsupported
from .modules import NVFP4Linear, bind_linears
from .parallel import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelDecoder", "local_heads", "unsupported_parallel"]


def unsupported_parallel(model: Any) -> str | None:
    """Why :class:`ParallelDecoder` cannot shard ``model``, or None: what
    :func:`~nvfp4_torch.lean_decoder.unsupported` says, or a decoder linear that is not
    NVFP4 (float linears of mixed checkpoints are not sharded)."""
    why = unsupported(model)
    if why is not None:
        return why
    for i, layer in enumerate(model.model.layers):
        for owner, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
            (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
        ):
            for name in names:
                if not isinstance(getattr(owner, name), NVFP4Linear):
                    kind = type(getattr(owner, name)).__name__
                    return f"layer {i} {name} is a {kind}, not NVFP4 (only NVFP4 linears shard)"
    return None


def _rows(bias: torch.Tensor | None, lo: int, hi: int) -> Any:
    """The rows ``[lo, hi)`` of a bias as a frozen parameter, or None."""
    if bias is None:
        return None
    return torch.nn.Parameter(bias.detach()[lo:hi].clone(), requires_grad=False)


def local_heads(plan: HeadPlan, rank: int) -> tuple[int, int, torch.Tensor | None]:
    """``(query heads, KV heads, kv_index)`` of ``rank`` under ``plan``: ``kv_index`` maps
    each of its query heads to its KV head (local numbering) where the uniform grouped
    rule (local query head ``j`` reads local KV head ``j // (heads / kv_heads)``) does not
    hold, which happens when KV heads are replicated over ranks (fewer KV heads than
    ranks); None where it holds."""
    q = plan.q[rank]
    kv_lo, kv_hi = plan.kv[rank]
    group = plan.q.size // plan.num_kv_heads
    heads, kv = q.size, kv_hi - kv_lo
    reads = [h // group - kv_lo for h in range(q.start, q.stop)]
    uniform = heads % kv == 0 and reads == [j // (heads // kv) for j in range(heads)]
    return heads, kv, None if uniform else torch.tensor(reads, dtype=torch.long)


class ParallelDecoder(LeanDecoder):
    """This rank's part of a greedy-decoding forward of a Llama-family model whose decoder
    linears are NVFP4 (see the module docstring). ``model``: from
    :func:`nvfp4_torch.loader.load_causal_lm` (or :func:`~nvfp4_torch.loader.load_model`:
    its own bindings are not used); ``backend``: the object every shard's products run on;
    ``group``: the process group (default: the default group); ``fuse``: q/k/v and gate/up
    shards share one product each (:func:`nvfp4_torch.modules.bind_linears`).

    Raises:
        RuntimeError: torch.distributed is not initialised.
        ValueError: the model is not one :func:`unsupported_parallel` accepts, or a plan
            cannot split it over the group (fewer units than ranks).
    """

    def __init__(
        self, model: Any, capacity: int, backend: Any, *, group: Any = None, fuse: bool = False
    ) -> None:
        why = unsupported_parallel(model)
        if why is not None:
            raise ValueError(f"ParallelDecoder: unsupported model: {why}")
        self.rank, self.world = rank_and_world(group)
        self.group = group
        self.backend = backend
        self.fuse = fuse
        cfg = model.config
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        #: the attention split (whole heads)
        self.head_plan: HeadPlan = head_plan(heads, kv_heads, head_dim, self.world)
        inter = int(model.model.layers[0].mlp.down_proj.in_features)
        #: down_proj's K plan; gate / up take its ranges (the paired rule)
        self.mlp_plan: ShardPlan = shard_plan(inter, self.world, dim="k", name="mlp")
        vocab = int(model.get_output_embeddings().out_features)
        #: the lm_head's vocabulary rows per rank
        self.vocab_plan: ShardPlan = shard_plan(vocab, self.world, dim="n", name="lm_head")
        self._local: dict[str, NVFP4Linear] = {}
        super().__init__(model, capacity)

    def _local_heads(self) -> tuple[int, int, torch.Tensor | None]:
        return local_heads(self.head_plan, self.rank)

    def _column(self, prefix: str, module: Any, plan: ShardPlan, lo: int, hi: int) -> Any:
        """The rank's rows ``[lo, hi)`` of a column-parallel linear, kept local (its output
        feeds this rank's heads or its row-parallel partner): the local NVFP4 linear."""
        layer = ColumnParallelLinear(module.planes(), plan, group=self.group, gather_output=False)
        local: NVFP4Linear = layer.linear
        local.bias = _rows(module.bias, lo, hi)
        self._local[prefix] = local
        return local

    def _row(self, prefix: str, module: Any, plan: ShardPlan) -> Any:
        """The rank's K columns of a row-parallel linear: float32 partials, summed."""
        bias = None if module.bias is None else module.bias.detach().clone()
        layer = RowParallelLinear(
            module.planes(), plan, group=self.group, input_is_parallel=True, bias=bias
        )
        self._local[prefix] = layer.linear
        return layer

    def _attention_linears(self, prefix: str, attn: Any) -> tuple[Any, Any, Any, Any]:
        hp, r = self.head_plan, self.rank
        q_plan = hp.q_rows()
        kv_plan = hp.kv_rows_plan(name=f"{prefix}.kv")
        q_rows, kv_rows = q_plan[r], hp.kv_rows(r)
        return (
            self._column(f"{prefix}.q_proj", attn.q_proj, q_plan, q_rows.start, q_rows.stop),
            self._column(f"{prefix}.k_proj", attn.k_proj, kv_plan, *kv_rows),
            self._column(f"{prefix}.v_proj", attn.v_proj, kv_plan, *kv_rows),
            self._row(f"{prefix}.o_proj", attn.o_proj, hp.o_k()),
        )

    def _mlp_linears(self, prefix: str, mlp: Any) -> tuple[Any, Any, Any]:
        k_plan = self.mlp_plan
        n_plan = paired_plan(k_plan)
        r = n_plan[self.rank]
        return (
            self._column(f"{prefix}.gate_proj", mlp.gate_proj, n_plan, r.start, r.stop),
            self._column(f"{prefix}.up_proj", mlp.up_proj, n_plan, r.start, r.stop),
            self._row(f"{prefix}.down_proj", mlp.down_proj, k_plan),
        )

    def _bind_layers(self) -> None:
        """Prepare every shard on the backend (fused siblings once, with ``fuse``)."""
        #: backend products per forward pass on this rank (the lm_head's not counted)
        self.products = bind_linears(self._local, self.backend, fuse=self.fuse)

    def _head_rows(self) -> tuple[int, int]:
        r = self.vocab_plan[self.rank]
        return r.start, r.stop

    def _head_module(self, head: Any) -> Any:
        layer = ColumnParallelLinear(
            head.planes(), self.vocab_plan, group=self.group, backend=self.backend
        )
        r = self.vocab_plan[self.rank]
        layer.linear.bias = _rows(head.bias, r.start, r.stop)
        return layer

    def _gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        return all_gather_last(local, self.vocab_plan.sizes, self.group)
