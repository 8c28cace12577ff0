"""Seeded test data: weights as planes and activations (and :func:`raw_planes`, planes
that skipped their own checks, for the tests that every entry point refuses them), and the
crafted activations that the activation encoders' tests share (:func:`rows_across_magnitudes`,
:func:`zero_blocks`, :func:`nonfinite_blocks`, :func:`scattered_inf`, :func:`q8_exact_halves`).

Every builder draws from the ``numpy.random.Generator`` it is given, so a seeded generator
gives the same bytes on every run and every backend (the conformance suite's certificates
depend on it).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import reference
from ..dtypes import OUTPUT_DTYPES
from ..planes import NVFP4Planes
from ..spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR, Q8_BLOCK_SIZE

__all__ = [
    "activations",
    "cancelling_blocks",
    "cancelling_halves",
    "globals_for",
    "llama_layer_shapes",
    "nonfinite_blocks",
    "q8_exact_halves",
    "random_planes",
    "raw_planes",
    "realistic_weight",
    "rows_across_magnitudes",
    "scattered_inf",
    "unit_scale_planes",
    "unrouted_nonfinite_rows",
    "zero_blocks",
]

#: The rows :func:`unrouted_nonfinite_rows` routes to no expert and fills with NaN / Inf.
UNROUTED_ROWS = (2, 7, 11)


def unrouted_nonfinite_rows(
    rng: np.random.Generator, x: npt.NDArray[Any], experts: int
) -> npt.NDArray[np.int64]:
    """Expert ids for the rows of ``x`` (at least 12), drawn from ``rng``, with rows 2, 7
    and 11 routed out of range (ids -1, ``experts`` and 99) and, in place, holding a NaN, a
    row of +Inf and a -Inf: a gather that computes an unrouted row gives NaN there, where
    the spec says exact zeros."""
    ids = np.asarray(rng.integers(0, experts, size=x.shape[0]), dtype=np.int64)
    ids[list(UNROUTED_ROWS)] = [-1, experts, 99]
    x[2, 5] = np.nan
    x[7, :] = np.inf
    x[11, 0] = -np.inf
    return ids


def llama_layer_shapes(hidden: int, intermediate: int, kv: int) -> dict[str, tuple[int, int]]:
    """The seven linear weights of one Llama decoder layer, ``(N, K)`` by their name under
    ``model.layers.<i>.``: attention q/k/v/o (k and v ``kv`` rows) and the gated MLP."""
    return {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (kv, hidden),
        "self_attn.v_proj": (kv, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (intermediate, hidden),
        "mlp.up_proj": (intermediate, hidden),
        "mlp.down_proj": (hidden, intermediate),
    }


def globals_for(
    rng: np.random.Generator, experts: int | None, parts: tuple[int, ...] | None
) -> npt.NDArray[np.float32]:
    """Distinct, realistic decode globals (``amax / 2688`` for amax in ~[0.05, 20]) of the
    shape a tensor with these experts / partitions carries."""
    shape = ((experts,) if experts else ()) + ((len(parts) - 1,) if parts else ())
    amax = np.exp(rng.uniform(np.log(0.05), np.log(20.0), size=shape))
    return np.asarray(amax / GLOBAL_AMAX_DIVISOR, dtype=np.float32)


def random_planes(
    rng: np.random.Generator,
    n: int,
    k: int,
    *,
    experts: int | None = None,
    partitions: tuple[int, ...] | None = None,
    scale_bytes: tuple[int, int] = (0x00, 0x7E),
    global_scale: Any = None,
    name: str = "w",
) -> NVFP4Planes:
    """Uniformly random codes (all 16) and scale bytes in ``scale_bytes`` (inclusive; by
    default every valid one), globals from :func:`globals_for` unless ``global_scale``."""
    lead = (experts, n) if experts else (n,)
    codes = rng.integers(0, 256, size=(*lead, k // 2), dtype=np.uint8)
    lo, hi = scale_bytes
    scales = rng.integers(lo, hi + 1, size=(*lead, k // BLOCK_SIZE), dtype=np.uint8)
    g = globals_for(rng, experts, partitions) if global_scale is None else global_scale
    return NVFP4Planes(codes, scales, np.asarray(g, dtype=np.float32), partitions, name)


def realistic_weight(
    rng: np.random.Generator,
    n: int,
    k: int,
    *,
    experts: int | None = None,
    partitions: tuple[int, ...] | None = None,
    name: str = "w",
    outliers: bool = True,
    partition_step: float = 2.0,
    expert_base: float = 0.25,
) -> NVFP4Planes:
    """A weight as a checkpoint holds it: Gaussian rows with log-normal magnitudes (and,
    with ``outliers``, an occasional outlier), quantized by the reference encoder, each
    expert and partition with its own ``amax / 2688`` global. Partition ``i`` is scaled by
    ``partition_step ** i`` and expert ``e`` by ``expert_base * 2 ** e``, so their globals
    differ."""
    lead = (experts, n) if experts else (n,)
    w = rng.standard_normal((*lead, k)).astype(np.float32)
    w *= np.exp(rng.normal(0.0, 0.7, size=(*lead, 1))).astype(np.float32)
    if outliers:
        flat = w.reshape(-1)
        picked = rng.integers(0, flat.size, size=max(1, flat.size // 4096))
        flat[picked] *= np.float32(8.0)
    if partitions is not None:
        for i, (a, b) in enumerate(itertools.pairwise(partitions)):
            w[..., a:b, :] *= np.float32(partition_step**i)
    if experts:
        w *= (expert_base * 2.0 ** np.arange(experts, dtype=np.float32))[:, None, None]
    return reference.quantize(w, partitions=partitions, name=name)


def activations(rng: np.random.Generator, m: int, k: int, dtype: str) -> npt.NDArray[Any]:
    """``[m, k]`` activations with a spread of row magnitudes (Gaussian rows scaled by
    log-normal factors), rounded to float32 and then to the output dtype named ``dtype``."""
    x = rng.standard_normal((m, k)) * np.exp(rng.normal(0.0, 1.0, size=(m, 1)))
    return x.astype(np.float32).astype(OUTPUT_DTYPES[dtype])


# ------------------------------------------------- crafted activations of the encoder tests
def rows_across_magnitudes(
    rng: np.random.Generator, m: int, k: int, lo: float, hi: float
) -> npt.NDArray[np.float32]:
    """Gaussian ``[m, k]`` float32 activations whose rows are scaled from ``10 ** lo`` (row
    0) to ``10 ** hi`` (row ``m - 1``), evenly in log (``numpy.logspace(lo, hi, m)``)."""
    return (rng.standard_normal((m, k)) * np.logspace(lo, hi, m)[:, None]).astype(np.float32)


def zero_blocks(
    rng: np.random.Generator, m: int, k: int, zeros: int | None = None
) -> npt.NDArray[np.float32]:
    """Gaussian ``[m, k]`` float32 activations whose first ``zeros`` elements of every row
    (half of it by default) are zero: whole zero blocks next to ordinary ones."""
    zeros = k // 2 if zeros is None else zeros
    return np.where(np.arange(k) < zeros, 0.0, rng.standard_normal((m, k))).astype(np.float32)


def nonfinite_blocks(
    rng: np.random.Generator, m: int, k: int, fraction: float
) -> npt.NDArray[np.float32]:
    """Gaussian ``[m, k]`` float32 activations with about ``fraction`` of the elements NaN
    and about ``fraction`` of the others -Inf: blocks holding a non-finite element next to
    finite ones."""
    return np.where(
        rng.random((m, k)) < fraction,
        np.float32(np.nan),
        np.where(rng.random((m, k)) < fraction, np.float32(-np.inf), rng.standard_normal((m, k))),
    ).astype(np.float32)


def scattered_inf(
    rng: np.random.Generator, m: int, k: int, fraction: float
) -> npt.NDArray[np.float32]:
    """Gaussian ``[m, k]`` float32 activations with about ``fraction`` of the elements +Inf
    (and no NaN)."""
    return np.where(
        rng.random((m, k)) < fraction, np.float32(np.inf), rng.standard_normal((m, k))
    ).astype(np.float32)


def q8_exact_halves(rng: np.random.Generator, m: int, k: int) -> npt.NDArray[np.float32]:
    """``[m, k]`` float32 activations whose int8 blocks (W4A8, :data:`Q8_BLOCK_SIZE` along
    K) each start with 127 - amax 127, so ``d = 1`` and ``id = 1`` - and hold exact halves
    ``c + 0.5`` (``c`` in ``[-126, 126)``) elsewhere: every other element a rounding tie."""
    x = (rng.integers(-126, 126, size=(m, k)) + 0.5).astype(np.float32)
    x[:, ::Q8_BLOCK_SIZE] = np.float32(127.0)
    return x


def unit_scale_planes(codes: Any, name: str = "w") -> NVFP4Planes:
    """Planes of the E2M1 codes ``[n, k]`` (one code a byte, unpacked) with every scale
    byte 0x38 (1.0) and global 1, so the weight is ``e2m1(codes)`` exactly: code 2 is 1.0,
    10 is -1.0, 0 is 0. For cases whose expected output follows from the codes alone."""
    c = np.asarray(codes, dtype=np.uint8)
    return NVFP4Planes(
        codes=reference.pack_codes(c),
        scales=np.full((c.shape[0], c.shape[1] // BLOCK_SIZE), 0x38, np.uint8),
        global_scale=np.asarray(1.0, np.float32),
        name=name,
    )


def cancelling_blocks() -> tuple[npt.NDArray[np.float32], NVFP4Planes]:
    """``(x [1, 32], planes [1, 32])``, valid and finite, whose one output cancels: weight
    block 0 is +6 x 448 sixteen times and block 1 -6 x 448, x's second half its first plus
    2^-20-sized noise. Every float32 order of the sum is off by a large part of the result
    (spec 1.3, "Tolerances")."""
    codes = np.zeros((1, 16), np.uint8)
    codes[0, :8] = 0x77  # code 7 (+6.0) in both nibbles
    codes[0, 8:] = 0xFF  # code 15 (-6.0)
    planes = NVFP4Planes(
        codes=codes,
        scales=np.array([[0x7E, 0x7E]], np.uint8),  # 448
        global_scale=np.asarray(1.0, np.float32),
        name="cancel",
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal(16).astype(np.float32)
    b = (a + np.float32(2.0**-20) * rng.standard_normal(16).astype(np.float32)).astype(np.float32)
    return np.concatenate([a, b])[None, :].astype(np.float32), planes


def cancelling_halves(
    rng: np.random.Generator,
    m: int,
    n: int,
    k: int,
    *,
    global_scale: float = 1.0,
    depth: tuple[float, float] = (4.0, 22.0),
    name: str = "halves",
) -> tuple[npt.NDArray[np.float32], NVFP4Planes]:
    """``(x [m, k], planes [n, k])``, valid and finite, whose every output cancels across
    K's halves: the first half's codes non-negative, the second half the same codes negated
    under the same scale bytes (drawn from 0x30-0x7E), x's first half ``|normal|`` and its
    second half the first times ``1 + 2^-U(depth)`` (one factor a row: the outputs cancel
    to about ``2^-depth`` of ``S``). A sequential sum
    climbs to ``S / 2`` and comes back down to almost nothing; split at K's middle (a
    row-parallel layer at two ranks) each rank's partial is half of ``S`` and the two
    cancel in the all-reduce. ``k`` a multiple of 32."""
    if k % (2 * BLOCK_SIZE):
        raise ValueError(f"cancelling_halves: k must be a multiple of 32, found {k}")
    half = rng.integers(0, 256, (n, k // 4), dtype=np.uint8) & 0x77  # sign bits clear
    codes = np.concatenate([half, half ^ 0x88], axis=1)  # negating flips each sign bit
    s = rng.integers(0x30, 0x7F, (n, k // 32), dtype=np.uint8)
    planes = NVFP4Planes(
        codes=codes,
        scales=np.concatenate([s, s], axis=1),
        global_scale=np.asarray(global_scale, np.float32),
        name=name,
    )
    xa = np.abs(rng.standard_normal((m, k // 2)))
    xb = xa * (1 + 2.0 ** -rng.uniform(*depth, (m, 1)))
    return np.concatenate([xa, xb], axis=1).astype(np.float32), planes


def raw_planes(
    codes: Any,
    scales: Any,
    global_scale: Any,
    partitions: Any = None,
    name: str = "bad",
) -> NVFP4Planes:
    """An :class:`NVFP4Planes` made WITHOUT its structural checks (as a buggy loader or a
    hand-built object could produce), for the tests that every entry point refuses it."""
    p = object.__new__(NVFP4Planes)
    for field, value in (
        ("codes", codes),
        ("scales", scales),
        ("global_scale", global_scale),
        ("partitions", partitions),
        ("name", name),
    ):
        object.__setattr__(p, field, value)
    return p
