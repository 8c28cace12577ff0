"""The ``ggml`` adapter: ggml-cpu's NVFP4 decode, Q8_0 quantizer and W4A8 matmuls against
the reference (spec 1.1)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import rel_error, weight
from nvfp4 import PlaneError, reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.tolerances import tolerance
from nvfp4_engines import _libggml


def test_declares_w4a8_not_w4a16(backend) -> None:
    assert "w4a8" in backend.info.capabilities
    assert "qmm" not in backend.info.capabilities
    assert not backend.has("qmm")


def test_dequantize_exact_with_partitions_and_experts(backend) -> None:
    fused = fuse([weight(8, 64, 0, 0.01), weight(8, 64, 1, 50.0)], "qk")
    stack = stack_experts([weight(8, 128, 2), weight(8, 128, 3, 3.0)], "moe")
    for p in (fused, stack):
        assert np.array_equal(backend.dequantize(p), reference.dequantize(p))


def test_q8_quantizer_matches_the_reference(backend, rng) -> None:
    x = rng.standard_normal((6, 128)).astype(np.float32)
    got, ref = backend.quantize_activations_q8(x), reference.quantize_activations_q8(x)
    assert np.array_equal(got.d.view(np.uint16), ref.d.view(np.uint16))
    assert np.array_equal(got.codes, ref.codes)


def test_qmm_w4a8_within_the_spec(backend, rng) -> None:
    p = fuse([weight(24, 256, 4), weight(16, 256, 5, 7.0)], "gate_up")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    y = backend.qmm_w4a8(x, p)
    assert rel_error(y, reference.qmm_w4a8(x, p, out_dtype=None)) <= tolerance("w4a8", "float32")


def test_gather_qmm_w4a8_in_range_and_refused_out_of_range(backend, rng) -> None:
    p = stack_experts([weight(16, 64, 6), weight(16, 64, 7, 4.0)], "moe")
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids = np.array([1, 0, 0, 1, 1], np.int32)
    y = backend.gather_qmm_w4a8(x, p, ids)
    ref = reference.gather_qmm_w4a8(x, p, ids, out_dtype=None)
    assert rel_error(y, ref) <= tolerance("w4a8", "float32")
    with pytest.raises(ValueError, match=r"expert id -1 at row 0 is outside \[0, 2\)"):
        backend.gather_qmm_w4a8(x[:1], p, np.array([-1], np.int32))


def test_quantizer_is_ggmls_with_global_one(backend, rng) -> None:
    x = rng.standard_normal((3, 128)).astype(np.float32)
    got = backend.quantize_activations(x, input_scale=1.0)
    ref = reference.quantize_activations(x, 1.0)
    assert float(got.global_scale) == 1.0
    assert np.array_equal(got.scales, ref.scales)  # normal data: the spec's scale bytes
    with pytest.raises(PlaneError, match=r"'activation'.*multiple of 64.*K = 48"):
        backend.quantize_activations(x[:, :48])


def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process (/proc/self/maps), or ''."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            if lo <= address < hi:
                return parts[-1] if len(parts) > 5 else ""
    return ""


def test_backend_dl_variants_each_run_their_own_code() -> None:
    """On a backend-DL build (per-CPU variants), every variant this CPU runs opens beside the
    others, its NVFP4 and Q8_0 vec_dot lie in its own library (no variant's symbols stand in
    for another's), and the default is the variant with the highest ggml_backend_score."""
    folder = _libggml._library_folder(None)[0]
    variants = _libggml._variants(folder)
    if not variants:
        pytest.skip(f"{folder} is a plain build: no per-CPU variants to check")
    opened, scores = {}, {}
    for name, path in variants.items():
        score = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL).ggml_backend_score
        score.restype = ctypes.c_int
        scores[name] = score()
        if scores[name] > 0:
            opened[name] = _libggml.load(None, name)
    assert opened, f"no variant of {sorted(variants)} runs on this CPU"
    for name, g in opened.items():
        assert g.variant == name
        for ggml_type in (_libggml.GGML_TYPE_NVFP4, _libggml.GGML_TYPE_Q8_0):
            address = ctypes.cast(g.traits_cpu(ggml_type).vec_dot, ctypes.c_void_p).value
            assert _mapped_file(address or 0) == str(Path(variants[name]).resolve())
    assert _libggml.load().variant == max(opened, key=lambda n: scores[n])


def test_libggml_is_found_where_it_is_installed(monkeypatch) -> None:
    """NVFP4_GGML_LIB_DIR wins; without it, libggml-python's prebuilt libraries, else
    llama-cpp-python's bundled ones; the availability names the one loaded."""
    monkeypatch.setenv(_libggml.LIB_DIR_ENV, "/nonexistent-ggml-folder")
    with pytest.raises(_libggml.GgmlUnavailable, match="not a folder"):
        _libggml._library_folder(None)
    monkeypatch.delenv(_libggml.LIB_DIR_ENV)
    folder, kind = _libggml._library_folder(None)
    assert kind in _libggml.DISTRIBUTIONS
    assert folder.is_dir()
    if importlib.util.find_spec("libggml") is not None:
        assert kind == "libggml-python"


def test_one_threadpool_serves_every_graph(backend, rng, monkeypatch) -> None:
    """The adapter plans every graph on one persistent ggml threadpool of THREADS workers
    (no thread start per graph), and its products are those of ggml's own per-graph
    threads, bit for bit."""
    from nvfp4_engines import ggml as adapter

    g = _libggml.load()
    pool = g.threadpool(adapter.THREADS)
    assert pool is not None, "libggml 0.20.2 has the threadpool API"
    assert g.threadpool(adapter.THREADS) == pool
    planned = []
    plan = g.cpu.ggml_graph_plan

    def spy(graph, n_threads, threadpool):
        cplan = plan(graph, n_threads, threadpool)
        planned.append(threadpool)
        assert cplan.n_threads == adapter.THREADS
        assert cplan.threadpool == threadpool  # ggml keeps the pool it was given
        return cplan

    p = weight(40, 256, 7)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    monkeypatch.setattr(g.cpu, "ggml_graph_plan", spy)
    pooled = [backend.qmm_w4a8(x, p) for _ in range(3)]
    assert planned
    assert set(planned) == {pool}
    monkeypatch.setattr(type(g), "threadpool", lambda self, n: None)
    fresh = backend.qmm_w4a8(x, p)
    assert planned[-1] is None
    for y in pooled:
        assert np.array_equal(y, fresh)
