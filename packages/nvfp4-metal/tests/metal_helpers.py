"""Helpers for the nvfp4-metal tests: seeded planes, conversions and the spec error measure."""

from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE
from nvfp4.tolerances import tolerance

NP_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


def to_np(a: mx.array) -> npt.NDArray[Any]:
    """An mx array as numpy, bfloat16 as ml_dtypes.bfloat16."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(a)


def random_planes(
    rng: np.random.Generator,
    n: int,
    k: int,
    *,
    experts: int | None = None,
    partitions: tuple[int, ...] | None = None,
    name: str = "w",
) -> NVFP4Planes:
    """Every code, every valid scale byte, distinct realistic globals per expert/partition."""
    lead = (experts, n) if experts else (n,)
    codes = rng.integers(0, 256, size=(*lead, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(*lead, k // BLOCK_SIZE), dtype=np.uint8)
    gshape = ((experts,) if experts else ()) + ((len(partitions) - 1,) if partitions else ())
    g = (np.exp(rng.uniform(np.log(0.05), np.log(20.0), size=gshape)) / 2688.0).astype(np.float32)
    return NVFP4Planes(codes, scales, np.asarray(g, np.float32), partitions, name)


def realistic_planes(
    rng: np.random.Generator,
    n: int,
    k: int,
    *,
    experts: int | None = None,
    partitions: tuple[int, ...] | None = None,
    name: str = "w",
) -> NVFP4Planes:
    """Gaussian weights quantized by the reference encoder (own global per expert/partition)."""
    lead = (experts, n) if experts else (n,)
    w = rng.standard_normal((*lead, k)).astype(np.float32)
    w *= np.exp(rng.normal(0.0, 0.7, size=(*lead, 1))).astype(np.float32)
    if partitions is not None:
        for i, (a, b) in enumerate(itertools.pairwise(partitions)):
            w[..., a:b, :] *= np.float32(3.0**i)
    if experts:
        w *= (2.0 ** np.arange(experts, dtype=np.float32))[:, None, None]
    return reference.quantize(w, partitions=partitions, name=name)


def activations(rng: np.random.Generator, m: int, k: int, dtype: str) -> npt.NDArray[Any]:
    x = rng.standard_normal((m, k)) * np.exp(rng.normal(0.0, 1.0, size=(m, 1)))
    return x.astype(np.float32).astype(NP_DTYPES[dtype])


def rel_err(found: Any, ref: npt.NDArray[Any]) -> float:
    """Spec 1.0's measure: max|y - ref| / max|ref| (inf when found is not finite)."""
    f = np.asarray(found).astype(np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.isfinite(f).all():
        return float("inf")
    return float(np.abs(f - r).max() / max(np.abs(r).max(), 1e-300))


def assert_within(found: Any, ref: npt.NDArray[Any], path: str, dtype: str, what: str) -> float:
    err = rel_err(found, ref)
    tol = tolerance(path, dtype)
    assert err <= tol, f"{what}: max|err|/max|ref| = {err:.3g} > {path} tolerance {tol:g} ({dtype})"
    return err
