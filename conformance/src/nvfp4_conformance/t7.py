"""Tier T7 (sharded, spec 1.2 "Sharding"): the backend under test on every rank of a
real ``torch.distributed`` process group (gloo on CPUs), its weights cut by the shard plan.

One spawn of :data:`MAX_WORLD` processes runs every world size: for each ``world`` in
:data:`WORLDS`, ranks ``0 .. world-1`` form a group (``torch.distributed.new_group``) and run
every case of :data:`CASES` on it. Each rank resolves the backend by its name
(:func:`nvfp4.get_backend`, the path users take), cuts its shard with
:func:`nvfp4.shard_planes.shard_planes` and computes with the backend's own verbs:

* ``row``: a row-parallel ``qmm`` (K split in whole blocks, optionally in 64-value units
  with a zero-padded last rank): the rank's float32 partial (``out_dtype="float32"``, x in
  the case's dtype), summed over the group in float32, cast once;
* ``column``: a column-parallel ``qmm`` (N rows, or a fused weight split per partition: q/k/v
  by the attention head plan, gate/up by the down projection's K plan with each partition's
  padded rows at its end): each rank's own rows, and for an unreplicated split the columns
  gathered across ranks;
* ``experts``: expert-parallel ``gather_qmm``: experts by index, ids of other ranks'
  experts out of range on a rank (zero rows), the float32 partials summed.

Every rank writes its outputs (as float32: float16 / bfloat16 values convert exactly) to
``<folder>/w<world>_r<rank>.npz``; the tier's tests
(:mod:`nvfp4_conformance.tiers.test_t7_sharded`) compare them with the float64 unsharded
reference. The inputs are made once by the parent (:func:`write_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nvfp4.shard_plan import ShardRange

__all__ = [
    "CANCELLING_FROM_SPEC",
    "CASES",
    "MAX_WORLD",
    "PARITY_WORLDS",
    "T7_FROM_SPEC",
    "WORLDS",
    "Case",
    "rank_columns",
    "run_ranks",
    "t7_applies",
    "write_inputs",
]

#: The spec version T7 belongs to (1.2's "Sharding" section).
T7_FROM_SPEC = "1.2"


def _version_key(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in v.split("."))
    except ValueError:
        return (-1,)


def t7_applies(spec_version: str | None, tiers_selected: frozenset[str] | None) -> bool:
    """Whether a run collects T7: the certified version is :data:`T7_FROM_SPEC` or later,
    or ``--nvfp4-tiers`` names T7. Otherwise T7 is not collected at all (neither run nor
    "left out"), so a 1.0 / 1.1 certificate means what it meant before T7 existed."""
    if tiers_selected is not None and "T7" in tiers_selected:
        return True
    return spec_version is not None and _version_key(spec_version) >= _version_key(T7_FROM_SPEC)


WORLDS = (2, 3, 4, 8)
MAX_WORLD = max(WORLDS)
#: World sizes of T7's greedy parity (T6's model and tokens, tensor-parallel): SmolLM2's
#: 9 query / 3 KV heads split unevenly by KV groups at 2 (6 + 3 heads), evenly at 3.
PARITY_WORLDS = (2, 3)
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Case:
    """One T7 case: a layer of a real model, split one way.

    Attributes:
        name: the case id.
        kind: ``"row"``, ``"column"``, ``"qkv"`` (fused q/k/v by the head plan),
            ``"gate_up"`` (fused gate/up, ``n // 2`` rows each, by the down projection's K
            plan) or ``"experts"``.
        source: the model (and layer) the shape comes from.
        m, n, k: rows of x, output rows, contraction length.
        align: the K plan's alignment in blocks (``"row"``, ``"gate_up"``).
        experts: E for ``"experts"``.
        heads: ``(heads, kv_heads, head_dim)`` for ``"qkv"`` and the head-planned ``"row"``.
        capability: the backend capability the case certifies.
        cancels: a ``"row"`` case whose data cancel across K's halves
            (:func:`nvfp4.testing.cancelling_halves`): judged from spec
            :data:`CANCELLING_FROM_SPEC` on, where a row-parallel sum has the accumulation
            floor.
    """

    name: str
    kind: str
    source: str
    m: int
    n: int
    k: int
    align: int = 1
    experts: int = 0
    heads: tuple[int, int, int] | None = None
    capability: str = "qmm"
    cancels: bool = False


#: The spec version from which a row-parallel sum has the accumulation floor (1.4), so from
#: which the cases that cancel (``Case.cancels``) are judged: under 1.2 and 1.3 no float32
#: implementation conforms on them.
CANCELLING_FROM_SPEC = "1.4"
SMOLLM2_HEADS = (9, 3, 64)
CASES: tuple[Case, ...] = (
    Case("down_1856", "row", "Nemotron-3-Nano-30B-A3B routed expert down_proj (K 1,856)", 3, 32, 1856),
    Case("down_1856_align128", "row", "the same, kernel alignment 128 (padded last rank)", 3, 32, 1856, align=8),
    Case("o_2880", "row", "a 2,880 hidden size (o_proj / down_proj K)", 2, 24, 2880),
    Case("down_640_align64", "row", "a 640-wide MoE expert down_proj, kernel alignment 64", 3, 32, 640, align=4),
    Case("o_576_heads", "row", "SmolLM2-135M o_proj, K split by 9 / 3 heads", 2, 40, 576, heads=SMOLLM2_HEADS),
    Case("o_576_cancelling", "row", "SmolLM2-135M o_proj's K (576), data whose halves of K cancel: at TP2 one rank's partial against the other's", 3, 8, 576, cancels=True),
    Case("gate_1856", "column", "Nemotron-3-Nano-30B-A3B routed expert gate_proj (N 1,856)", 3, 1856, 64),
    Case("hidden_2880", "column", "a 2,880 hidden size (N 2,880 at any row)", 2, 2880, 32),
    Case("qkv_576", "qkv", "SmolLM2-135M fused q/k/v by 9 / 3 heads", 2, 960, 576, heads=SMOLLM2_HEADS),
    Case("w13_640_align64", "gate_up", "a Qwen-style MoE expert's fused w13 (moe_intermediate 640: gate/up 2 x 640 rows), kernel alignment 64", 3, 1280, 64, align=4),
    Case("w13_1856_align128", "gate_up", "a fused gate/up at Nemotron-3-Nano-30B-A3B's routed-expert width 1,856 (2 x 1,856 rows), kernel alignment 128: each partition's last rank padded", 3, 3712, 64, align=8),
    Case("experts_1856", "experts", "Nemotron-3-Nano-30B-A3B experts (E 16 of 128, K 1,856)", 12, 16, 1856, experts=16, capability="gather_qmm"),
)  # fmt: skip


def write_inputs(folder: Path) -> None:
    """The weights (reference-quantized, realistic) and activations of every case, one
    ``<case>.npz`` each, with expert ids for ``"experts"``."""
    from nvfp4.fusion import fuse
    from nvfp4.testing import activations, cancelling_halves

    from .cases import case_rng, realistic_weight

    for c in CASES:
        rng = case_rng("t7", c.name)
        if c.kind == "experts":
            # expert e scaled by 2**(e - 10): globals 2**15 apart, outputs finite in float16
            w = realistic_weight(rng, c.n, c.k, name=c.name, experts=c.experts, expert_base=2**-10)
            ids = rng.integers(-2, c.experts + 2, size=c.m)  # a few out of range
        elif c.kind == "qkv":
            heads, kv, hd = c.heads or SMOLLM2_HEADS
            parts = [
                realistic_weight(rng, rows, c.k, name=f"{c.name}.{p}")
                for p, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd))
            ]
            w, ids = fuse(parts, c.name), np.zeros(0, np.int64)
        elif c.kind == "gate_up":  # each half its own global, as a fused checkpoint keeps
            parts = [
                realistic_weight(rng, c.n // 2, c.k, name=f"{c.name}.{p}") for p in ("gate", "up")
            ]
            w, ids = fuse(parts, c.name), np.zeros(0, np.int64)
        elif c.cancels:  # to 2^-18..2^-22 of S; a realistic global (a layer's 2^-8)
            x, w = cancelling_halves(
                rng, c.m, c.n, c.k, global_scale=2.0**-8, depth=(18.0, 22.0), name=c.name
            )
            ids = np.zeros(0, np.int64)
        else:
            w, ids = realistic_weight(rng, c.n, c.k, name=c.name), np.zeros(0, np.int64)
        if not c.cancels:
            x = activations(rng, c.m, c.k, "float32")
        np.savez(
            folder / f"{c.name}.npz",
            codes=w.codes,
            scales=w.scales,
            global_scale=w.global_scale,
            partitions=np.asarray(w.partitions or (), np.int64),
            x=x,
            ids=ids.astype(np.int64),
        )


def load_case(folder: Path, c: Case) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(planes, x float32, ids)`` of case ``c`` from :func:`write_inputs`' file."""
    from nvfp4.planes import NVFP4Planes

    d = np.load(folder / f"{c.name}.npz")
    parts = tuple(int(b) for b in d["partitions"]) or None
    w = NVFP4Planes(d["codes"], d["scales"], d["global_scale"], partitions=parts, name=c.name)
    return w, d["x"], d["ids"]


def x_in(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to ``dtype`` (the x a backend is given for that output dtype)."""
    from nvfp4.dtypes import OUTPUT_DTYPES

    return x.astype(OUTPUT_DTYPES[dtype])


def plans_of(c: Case, world: int) -> Any:
    """The plan(s) of case ``c`` at ``world`` ranks."""
    from nvfp4.fused_plan import fused_gate_up_plan
    from nvfp4.shard_plan import expert_plan, head_plan, shard_plan

    if c.kind == "row":
        if c.heads is not None:
            return head_plan(*c.heads, world, name=c.name).o_k()
        return shard_plan(c.k, world, dim="k", align=c.align, name=c.name)
    if c.kind == "column":
        return shard_plan(c.n, world, dim="n", name=c.name)
    if c.kind == "qkv":
        h = head_plan(*(c.heads or SMOLLM2_HEADS), world, name=c.name)
        kv = h.kv_rows_plan(name=f"{c.name}.kv")
        return [h.q_rows(), kv, kv]
    if c.kind == "gate_up":
        return fused_gate_up_plan(c.n // 2, world, align=c.align, name=c.name)
    return expert_plan(c.experts, world, name=c.name)


def rank_columns(x: np.ndarray, r: ShardRange) -> np.ndarray:
    """A row-parallel rank's columns of ``x [M, K]``: its K range ``r`` (a shard plan's
    rank, :class:`nvfp4.shard_plan.ShardRange`), zero-padded to ``r.padded``."""
    xr = np.zeros((x.shape[0], r.padded), dtype=x.dtype)
    xr[:, : r.size] = x[:, r.start : r.stop]
    return xr


def rank_cases(ops: Any, folder: str, backend_name: str, caps: tuple[str, ...]) -> None:
    """Every case on this rank (``ops``: a :class:`nvfp4_torch.ranks.GroupOps`); writes
    ``<folder>/w<world>_r<rank>.npz``. What the backend raises for one case and dtype is
    kept as ``<case>|<dtype>|error`` (the case's tests fail with it) and the rank goes on
    with zeros in that case's collectives: one case the backend refuses (an expert id
    outside a rank's experts) leaves every other case judged."""
    import nvfp4
    from nvfp4.shard_planes import shard_fused, shard_planes

    backend = nvfp4.get_backend(backend_name)
    rank, world = ops.rank, ops.world
    out: dict[str, np.ndarray] = {}

    def qmm(x: np.ndarray, handle: Any, **kw: Any) -> np.ndarray:
        return np.asarray(backend.to_numpy(backend.qmm(backend.from_numpy(x), handle, **kw)))

    for c in CASES:
        if c.capability not in caps:
            continue
        w, x32, ids = load_case(Path(folder), c)
        plan = plans_of(c, world)
        if c.kind in ("qkv", "gate_up"):
            shard = shard_fused(w, plan, rank)
        else:
            shard = shard_planes(w, plan, rank)
        # what this rank holds of the output: the whole [M, N] of a sum, its rows otherwise
        width = shard.n if c.kind in ("column", "qkv", "gate_up") else c.n
        handle: Any = None
        for dtype in DTYPES:
            x = x_in(x32, dtype)
            key = f"{c.name}|{dtype}"
            try:
                handle = backend.prepare(shard) if handle is None else handle
                if c.kind == "row":
                    local = qmm(rank_columns(x, plan[rank]), handle, out_dtype="float32")
                elif c.kind == "experts":
                    local_ids = (ids - plan[rank].start).astype(np.int64)
                    y = backend.gather_qmm(
                        backend.from_numpy(x),
                        handle,
                        backend.from_numpy(local_ids),
                        out_dtype="float32",
                    )
                    local = np.asarray(backend.to_numpy(y), dtype=np.float32)
                else:
                    local = qmm(x, handle).astype(np.float32)  # exact: float16 / bfloat16 values
            # whatever the backend raises fails this case's tests (with its message), not
            # the tier; the rank still joins the collectives below, with zeros, so the
            # other ranks are not left waiting
            except Exception as exc:
                out[f"{key}|error"] = np.array(f"rank {rank}: {type(exc).__name__}: {exc}")
                local = np.zeros((c.m, width), np.float32)
            if c.kind in ("row", "experts"):  # the all-reduce of the partials
                out[key] = ops.all_reduce_f32(local).astype(x.dtype).astype(np.float32)
            else:
                out[key] = local
                if c.kind == "column":  # the gather: no arithmetic
                    out[f"{key}|gathered"] = ops.all_gather_last(local, plan.sizes)
    np.savez(Path(folder) / f"w{world}_r{rank}.npz", **out)


def run_ranks(
    folder: Path, backend_name: str, capabilities: frozenset[str]
) -> dict[int, list[dict[str, np.ndarray]]]:
    """Write the inputs, run every world size on spawned gloo ranks
    (:func:`nvfp4_torch.ranks.run_worlds`), and return ``{world: [outputs of rank r]}``.

    Raises:
        Exception: a rank failed (torch.multiprocessing re-raises its error).
    """
    from nvfp4_torch.ranks import run_worlds

    write_inputs(folder)
    run_worlds(
        rank_cases,
        WORLDS,
        (str(folder), backend_name, tuple(sorted(capabilities))),
        env={"NVFP4_CPU_THREADS": "1"},  # 8 ranks share the machine's cores
    )
    return {
        world: [dict(np.load(folder / f"w{world}_r{r}.npz")) for r in range(world)]
        for world in WORLDS
    }
