"""``nvfp4 convert`` is lossless or refuses: for each checkpoint feature that one output
flavour might not carry, converting to each of the four flavours either exits 0 with an
output that ``nvfp4 verify`` calls bit-identical to the source, or exits 2 with one line
naming the file or tensor, what the output needed and what was found, leaving nothing
behind.

The features: 3-D (stacked) expert weights stored whole, with per-expert globals, with one
global for all experts (shape ``()`` or ``(1,)``) and with per-expert input scales; experts
stored one by one with different globals and input scales, or with input scales on only
some of them; a ``(1,)`` global; a ModelOpt ``MIXED_PRECISION`` checkpoint with an FP8
layer; K not a multiple of 64; a ``BOOL`` tensor; a global whose reciprocal is not a normal
float32; and foreign GGUF files laid out as gguf-py (llama.cpp's converter) lays them out,
with the default and larger ``general.alignment``, or with a tensor offset off the
alignment.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4.fusion import stack_experts
from nvfp4.layouts import to_gguf, to_modelopt
from nvfp4.planes import NVFP4Planes
from nvfp4_checkpoints.cli import main
from small_models import llama_config

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
gguf = pytest.importorskip("gguf")

FLAVOURS = ("modelopt", "compressed-tensors", "mlx", "gguf")
CONFIG = llama_config()
Q = "model.layers.0.self_attn.q_proj"
K = "model.layers.0.self_attn.k_proj"
ODD = "model.layers.0.adapter.proj"  # no config dimension says its shape
STACK = "model.layers.0.mlp.experts.gate_up_proj"
UP = "model.layers.0.mlp.experts.{}.up_proj"
NORM = {"model.norm.weight": np.ones(64, np.float32)}


def _planes(seed: int, n: int = 64, k: int = 64, scale: float = 1.0) -> NVFP4Planes:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * scale
    return quantize(w, name=f"w{seed}")


def _modelopt_tensors(
    prefix: str, planes: NVFP4Planes, global_shape: tuple[int, ...] | None = None, inp: Any = None
) -> dict[str, Any]:
    """ModelOpt's tensors of ``planes``; ``global_shape``: the global stored as its first
    value in that shape (a stack sharing one global)."""
    m = to_modelopt(planes)
    g = np.asarray(m["weight_scale_2"], np.float32)
    if global_shape is not None:
        g = g.reshape(-1)[:1].reshape(global_shape)
    out = {f"{prefix}.weight": m["weight"], f"{prefix}.weight_scale": m["weight_scale"]}
    out[f"{prefix}.weight_scale_2"] = g
    if inp is not None:
        out[f"{prefix}.input_scale"] = np.asarray(inp, np.float32)
    return out


def _torch(a: Any) -> Any:
    a = np.asarray(a)
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.array(a))


def _modelopt_folder(
    path: Path, tensors: dict[str, Any], quantization: dict[str, Any] | None = None
) -> Path:
    """A ModelOpt export folder holding ``tensors`` exactly as given."""
    path.mkdir()
    st_torch.save_file({k: _torch(v) for k, v in tensors.items()}, str(path / "model.safetensors"))
    quant = quantization or {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}
    hq = {"producer": {"name": "modelopt"}, "quantization": quant}
    (path / "hf_quant_config.json").write_text(json.dumps(hq))
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def _gguf_file(path: Path, alignment: int | None = None, scale_of_one: bool = False) -> Path:
    """A GGUF as gguf-py writes it (llama.cpp's converter): no ``nvfp4.*`` keys, GGUF names,
    ``general.alignment`` when given; the ``.scale`` of a global of 1.0 omitted when
    ``scale_of_one`` (llama.cpp's converter omits it)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(1)
    nvfp4 = gguf.GGMLQuantizationType.NVFP4
    for i, (name, planes) in enumerate(
        (("blk.0.ffn_down", _planes(1)), ("blk.0.ffn_up", _planes(2)))
    ):
        if scale_of_one and i == 0:
            planes = planes.replace(global_scale=np.float32(1.0).reshape(()))
        data, scale = to_gguf(planes)
        w.add_tensor(f"{name}.weight", data, raw_dtype=nvfp4)
        if not (scale_of_one and i == 0):
            w.add_tensor(f"{name}.scale", scale)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _misalign(path: Path) -> Path:
    """Move the last tensor's data offset 4 bytes off the alignment (its data still inside
    the file): the tensor-info record's last 8 bytes hold the offset."""
    r = gguf.GGUFReader(str(path))
    last = r.tensors[-1]
    blob = bytearray(path.read_bytes())
    name = last.name.encode()
    at = blob.rindex(struct.pack("<Q", len(name)) + name)
    rank = struct.unpack_from("<I", blob, at + 8 + len(name))[0]
    off_at = at + 8 + len(name) + 4 + 8 * rank + 4
    (rel,) = struct.unpack_from("<Q", blob, off_at)
    struct.pack_into("<Q", blob, off_at, rel - 4)
    path.write_bytes(bytes(blob))
    return path


def _per_expert(inputs: list[float | None], globals_: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = dict(NORM)
    for i, inp in enumerate(inputs):
        out.update(
            _modelopt_tensors(
                UP.format(i), _planes(10 + i, scale=1 + i if globals_ else 1), inp=inp
            )
        )
    return out


def _stack(**kw: Any) -> dict[str, Any]:
    planes = stack_experts([_planes(20 + i, scale=1 + i) for i in range(3)], STACK)
    return {**_modelopt_tensors(STACK, planes, **kw), **NORM}


def _mixed_fp8(path: Path) -> Path:
    fp8 = np.random.default_rng(3).standard_normal((32, 64)).astype(ml_dtypes.float8_e4m3fn)
    tensors = {
        **_modelopt_tensors(Q, _planes(4), inp=0.5),
        f"{K}.weight": fp8,
        f"{K}.weight_scale": np.float32(0.1).reshape(()),
        f"{K}.input_scale": np.float32(0.2).reshape(()),
        **NORM,
    }
    quant = {
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {
            Q: {"quant_algo": "NVFP4", "group_size": 16},
            K: {"quant_algo": "FP8"},
        },
    }
    return _modelopt_folder(path, tensors, quant)


def _with_global(value: float) -> dict[str, Any]:
    planes = _planes(5).replace(global_scale=np.float32(value).reshape(()))
    return {**_modelopt_tensors(Q, planes), **NORM}


LOSSLESS = None
#: name -> (build(path) -> source path, {output flavour: None (lossless) or a refusal regex}).
CASES: dict[str, tuple[Callable[[Path], Path], dict[str, str | None]]] = {
    "3d stack, per-expert globals": (
        lambda p: _modelopt_folder(p, _stack()),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "3d stack, per-expert globals, an input scale": (
        lambda p: _modelopt_folder(p, _stack(inp=0.5)),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "3d stack, one global of shape ()": (
        lambda p: _modelopt_folder(p, _stack(global_shape=())),
        {
            **dict.fromkeys(FLAVOURS[:3], LOSSLESS),
            "gguf": rf"tensor '{STACK}': global for a GGUF expert stack: expected one global "
            r"per expert .*found one global for all experts",
        },
    ),
    "3d stack, one global of shape (1,)": (
        lambda p: _modelopt_folder(p, _stack(global_shape=(1,))),
        {
            **dict.fromkeys(FLAVOURS[:3], LOSSLESS),
            "gguf": rf"tensor '{STACK}': global for a GGUF expert stack",
        },
    ),
    "3d stack, per-expert input scales": (
        lambda p: _modelopt_folder(p, _stack(inp=np.array([0.5, 0.25, 0.125], np.float32))),
        dict.fromkeys(
            FLAVOURS,
            rf"tensor '{STACK}.input_scale': input scale: expected one value \(shape \(\) or "
            r"\(1,\)\), found \(3,\)",
        ),
    ),
    "experts one by one, different globals and input scales": (
        lambda p: _modelopt_folder(p, _per_expert([0.5, 0.25, 0.125])),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "experts one by one, different globals, no input scales": (
        lambda p: _modelopt_folder(p, _per_expert([None, None, None])),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "experts one by one, input scales on some": (
        lambda p: _modelopt_folder(p, _per_expert([None, 0.5, 0.5])),
        {
            **dict.fromkeys(FLAVOURS[:3], LOSSLESS),
            "gguf": r"experts\.\{\}\.up_proj: expert 'model\.layers\.0\.mlp\.experts\.0\.up_proj' "
            r"has no input_scale but others do",
        },
    ),
    "a global of shape (1,)": (
        lambda p: _modelopt_folder(p, {**_modelopt_tensors(Q, _planes(6), (1,), 0.5), **NORM}),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "MIXED_PRECISION with an FP8 layer": (
        _mixed_fp8,
        {
            "modelopt": LOSSLESS,
            **{
                f: rf"mixed: layer '{K}' is 'FP8' \(hf_quant_config.json's quantized_layers; "
                rf"1 such layers\): expected NVFP4 layers only for a {f} output"
                for f in FLAVOURS[1:]
            },
        },
    ),
    "K = 48": (
        lambda p: _modelopt_folder(p, {**_modelopt_tensors(ODD, _planes(7, k=48)), **NORM}),
        {
            **dict.fromkeys(FLAVOURS[:3], LOSSLESS),
            "gguf": rf"tensor '{ODD}': K for GGUF NVFP4: expected a multiple of 64, found K = 48",
        },
    ),
    "a BOOL tensor": (
        lambda p: _modelopt_folder(
            p, {**_modelopt_tensors(Q, _planes(8)), "model.mask": np.ones(8, bool), **NORM}
        ),
        {
            **dict.fromkeys(FLAVOURS[:3], LOSSLESS),
            "gguf": r"tensor 'model.mask': dtype BOOL has no GGUF type",
        },
    ),
    "a global of 1e-39 (subnormal)": (
        lambda p: _modelopt_folder(p, _with_global(1e-39)),
        {
            **dict.fromkeys(FLAVOURS, LOSSLESS),
            "compressed-tensors": rf"tensor '{Q}': reciprocal of decode global: expected a "
            r"normal float32",
        },
    ),
    "a global of 3e38 (reciprocal subnormal)": (
        lambda p: _modelopt_folder(p, _with_global(3e38)),
        {
            **dict.fromkeys(FLAVOURS, LOSSLESS),
            "compressed-tensors": rf"tensor '{Q}': reciprocal of decode global",
        },
    ),
    "foreign GGUF, default alignment": (
        lambda p: _gguf_file(p.with_suffix(".gguf")),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "foreign GGUF, general.alignment 64": (
        lambda p: _gguf_file(p.with_suffix(".gguf"), alignment=64),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "foreign GGUF, general.alignment 256, a scale of 1 omitted": (
        lambda p: _gguf_file(p.with_suffix(".gguf"), alignment=256, scale_of_one=True),
        dict.fromkeys(FLAVOURS, LOSSLESS),
    ),
    "foreign GGUF, a tensor offset off the alignment": (
        lambda p: _misalign(_gguf_file(p.with_suffix(".gguf"))),
        dict.fromkeys(
            FLAVOURS,
            r"mixed\.gguf: not a readable GGUF file: expected the data offset of "
            r"'output_norm\.weight' a multiple of general\.alignment \(32\), found \d+",
        ),
    ),
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for i, (name, (build, _)) in enumerate(CASES.items()):
        out[name] = build(tmp_path_factory.mktemp(f"case{i}") / "mixed")
    return out


@pytest.mark.parametrize(
    ("case", "flavour"),
    [(c, f) for c in CASES for f in FLAVOURS],
    ids=[f"{c}->{f}" for c in CASES for f in FLAVOURS],
)
def test_convert_is_lossless_or_refused(
    sources: dict[str, Path], tmp_path: Path, case: str, flavour: str
) -> None:
    src, want = sources[case], CASES[case][1][flavour]
    (tmp_path / "dst").mkdir()
    dst = tmp_path / "dst" / ("out.gguf" if flavour == "gguf" else "out")
    status, _, err = _run(["convert", str(src), str(dst), "--to", flavour])
    lines = [ln for ln in err.splitlines() if ln.startswith("nvfp4: error")]
    if want is LOSSLESS:
        assert status == 0, err
        status, out, err = _run(["verify", str(src), str(dst)])
        assert status == 0, out + err
        assert out.startswith("SAME "), out
        assert "bit-identical" in out, out
        return
    assert status == 2, err
    assert len(lines) == 1, err
    assert len(lines[0]) <= 400, lines[0]
    assert re.search(want, lines[0]), lines[0]
    assert os.listdir(tmp_path / "dst") == [], "a refusal left something behind"


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_our_gguf_is_laid_out_as_llama_cpp_requires(tmp_path: Path, alignment: int | None) -> None:
    """llama.cpp's loader requires every tensor's data offset to be the running sum of
    the previous tensors' sizes, each padded to ``general.alignment``: read by gguf-py
    (independent of our parser), the GGUF we write (from a foreign GGUF of any alignment,
    odd-sized tensors included) is laid out exactly so."""
    src = _gguf_file(tmp_path / "src.gguf", alignment=alignment)
    (tmp_path / "dst").mkdir()
    dst = tmp_path / "dst" / "out.gguf"
    status, _, err = _run(["convert", str(src), str(dst), "--to", "gguf"])
    assert status == 0, err
    r = gguf.GGUFReader(str(dst))
    align = int(r.alignment)
    assert r.data_offset % align == 0
    running = 0
    for t in r.tensors:  # in the order of the tensor-info records, as llama.cpp walks them
        assert t.data_offset - r.data_offset == running, (t.name, t.data_offset, running)
        running += -(-int(t.n_bytes) // align) * align
    assert len(r.tensors) == 5  # two NVFP4 weights with their scales, one norm
