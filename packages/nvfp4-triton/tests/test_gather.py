"""MoE gather: rows and grouped paths, sorted and unsorted ids, per-expert (and per expert
and partition) globals, ids outside [0, E) giving exact zeros without reading x's row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4_triton import ops
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.testing import DTYPES, TORCH, check_close, to_numpy, torch_activations
from nvfp4_triton.weights import upload

E = 4


def _experts(rng: np.random.Generator, n: int, k: int, parts=None):
    w = rng.standard_normal((E, n, k)).astype(np.float32)
    w *= (2.0 ** np.arange(E, dtype=np.float32))[:, None, None]  # distinct expert globals
    return reference.quantize(w, partitions=parts, name="experts")


def _ids(rng: np.random.Generator, m: int) -> np.ndarray:
    ids = rng.integers(0, E, m)
    bad = rng.choice(m, size=max(1, m // 4), replace=False) if m >= 3 else []
    ids[bad] = rng.choice([-1, E, E + 3, 1 << 20, -(1 << 20)], size=len(bad))
    return ids


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize("path", ops.GATHER_PATHS)
@pytest.mark.parametrize("m", [1, 3, 33])
def test_gather(cfg: KernelConfig, path: str, sort: bool, dtype: str, m: int) -> None:
    rng = np.random.default_rng(m * 7 + len(path) + sort)
    planes = _experts(rng, 21, 80)
    x, x32 = torch_activations(rng, m, 80, dtype)
    ids = _ids(rng, m)
    if sort:
        ids = np.sort(ids)
    oob = (ids < 0) | (ids >= E)
    x[torch.from_numpy(oob)] = float("nan")  # never read: the rows must still be exact zeros
    x32[oob] = 0.0
    id_t = torch.from_numpy(ids.astype(np.int32 if sort else np.int64))
    y = ops.gather(
        x, upload(planes, "cpu"), id_t, TORCH[dtype], cfg, path=path, sorted_indices=sort
    )
    assert y.dtype == TORCH[dtype]
    yn = to_numpy(y).astype(np.float64)
    assert (yn[oob] == 0).all(), "out-of-range rows must be zero"
    assert not np.signbit(yn[oob]).any(), "out-of-range rows must be +0"
    ref = reference.gather_qmm(x32, planes, ids, out_dtype=None)
    if (~oob).any():
        check_close(y[torch.from_numpy(~oob)], ref[~oob], "gather_qmm", dtype, f"{path} {dtype}")


@pytest.mark.parametrize("path", ops.GATHER_PATHS)
def test_expert_and_partition_globals(any_cfg: KernelConfig, path: str) -> None:
    """Fused gate/up experts: globals (E, P), one per expert and partition."""
    rng = np.random.default_rng(3)
    planes = _experts(rng, 24, 64, parts=(0, 10, 24))
    assert planes.global_scale.shape == (E, 2)
    x, x32 = torch_activations(rng, 20, 64, "float32")
    ids = _ids(rng, 20)
    y = ops.gather(
        x, upload(planes, "cpu"), torch.from_numpy(ids), torch.float32, any_cfg, path=path
    )
    oob = (ids < 0) | (ids >= E)
    assert (to_numpy(y)[oob] == 0).all()
    ref = reference.gather_qmm(x32, planes, ids, out_dtype=None)
    check_close(y[torch.from_numpy(~oob)], ref[~oob], "gather_qmm", "float32", path)


def test_grouped_tile_table_covers_every_valid_row_once() -> None:
    ids = torch.tensor([3, 0, 9, 3, 3, -1, 0, 1, 3, 3, 3, 3])
    perm, tiles, total = ops._grouped_tiles(ids, E, 4, False)
    assert total == 3 + 4
    assert tuple(tiles.shape) == (total, 3)
    assert tiles.dtype == torch.int64
    assert tiles.is_contiguous()
    expert, start, end = tiles.unbind(1)
    covered = []
    for t in range(total):
        if int(expert[t]) < E:
            pos = range(int(start[t]), min(int(start[t]) + 4, int(end[t])))
            covered += [int(perm[p]) for p in pos]
            assert all(int(ids[perm[p]]) == int(expert[t]) for p in pos)
    valid = [i for i, e in enumerate(ids.tolist()) if 0 <= e < E]
    assert sorted(covered) == valid


def test_false_sorted_promise_is_dropped(cfg: KernelConfig) -> None:
    """The kernel contract: the result never depends on the sorted hint being true (core
    refuses a false hint on host ids; device ids are checked here and the hint dropped)."""
    planes = _experts(np.random.default_rng(0), 8, 32)
    x = torch.randn((3, 32), generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([2, 0, 1])
    hinted = ops.gather(
        x, upload(planes, "cpu"), ids, torch.float32, cfg, path="grouped", sorted_indices=True
    )
    ref = reference.gather_qmm(x.numpy(), planes, ids.numpy(), out_dtype=None)
    check_close(hinted, ref, "gather_qmm", "float32", "false sorted hint")
