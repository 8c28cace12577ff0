"""The CLI on untrusted downloads: a table of hand-made hostile checkpoints (every class of
the README's "Safety" section) and a Hypothesis fuzz over headers and configs, each run
in-process under an audit hook (see :mod:`hostile`): exit 2, one line, no traceback, the
source untouched, nothing left next to the destination, nothing read outside, bounded time
and memory."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import assert_clean_refusal, assert_names, run_guarded, tree_hash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nvfp4 import quantize
from nvfp4.fusion import stack_experts
from nvfp4.layouts import to_gguf
from nvfp4_checkpoints import write_checkpoint
from nvfp4_checkpoints.safetensors_io import SafetensorsFile, save_file
from small_models import TOKENIZER_JSON

CONFIG = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64}
ST = "model.safetensors"
Q = "model.layers.0.self_attn.q_proj"
K = "model.layers.0.self_attn.k_proj"
V = "model.layers.0.self_attn.v_proj"


def _planes() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {
        p: quantize(rng.standard_normal((64, 64)).astype(np.float32), name=p) for p in (Q, K, V)
    }
    e = "model.layers.0.mlp.experts.{}.up_proj"
    experts = [quantize(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(2)]
    out[e] = stack_experts(experts, name=e)
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One good checkpoint of each flavour."""
    base = tmp_path_factory.mktemp("good")
    planes = _planes()
    tensors = {"model.norm.weight": np.ones(64, np.float32)}
    scales = {Q: 0.5, K: 0.25, V: 0.125}
    out = {}
    for flavour in ("modelopt", "compressed-tensors", "mlx"):
        out[flavour] = write_checkpoint(
            base / flavour,
            planes,
            flavour=flavour,
            tensors=tensors,
            config=CONFIG,
            input_scales=scales,
        )
        (out[flavour] / "notes.txt").write_text("notes\n")
    return out


# ====================================================================== mutations
def _json(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _raw_json(path: Path, text: str) -> None:
    path.write_text(text)


def _tensors(ck: Path, edit: Callable[[dict[str, np.ndarray]], Any]) -> None:
    with SafetensorsFile(ck / ST) as f:
        arrays = {n: np.array(f.get(n)) for n in f.names()}
    edit(arrays)
    save_file(ck / ST, arrays)


def _header(
    ck: Path, edit: Callable[[dict[str, Any]], Any] | None = None, raw: bytes = b""
) -> None:
    blob = (ck / ST).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    if edit is not None:
        header = json.loads(blob[8 : 8 + n])
        edit(header)
        raw = json.dumps(header).encode()
    (ck / ST).write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n :])


DEEP = "[" * 1000 + "]" * 1000


def _gguf(path: Path, *, kv: dict[str, tuple[str, Any]], tensors: list[tuple[Any, ...]]) -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (kind, value) in kv.items():
        getattr(w, f"add_{kind}")(key, value)
    for name, arr, *raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw[0] if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_case(kv: dict[str, tuple[str, Any]], experts: int = 2, scale_n: int | None = None):
    def build(work: Path) -> Path:
        gguf = pytest.importorskip("gguf")
        rng = np.random.default_rng(1)
        planes = stack_experts(
            [quantize(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(experts)],
            name="e",
        )
        data, scale = to_gguf(planes)
        n = scale_n if scale_n is not None else experts  # 0: no .scale tensor
        path = work / "m.gguf"
        _gguf(
            path,
            kv=kv,
            tensors=[
                ("blk.0.ffn_up_exps.weight", data, gguf.GGMLQuantizationType.NVFP4),
                *(
                    [("blk.0.ffn_up_exps.scale", np.resize(scale, n).astype(np.float32))]
                    if n
                    else []
                ),
                ("output_norm.weight", np.ones(64, np.float32)),
            ],
        )
        return path

    return build


def _raw_gguf(tensors: list[tuple[str, list[int], int, int]], data: bytes) -> Any:
    """A GGUF file written byte by byte (version 3, alignment 32), so that its tensor
    infos can say what no writer would: ``(name, ne, ggml type, offset)`` each."""

    def text(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def build(work: Path) -> Path:
        out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
        out += text("general.architecture") + struct.pack("<I", 8) + text("llama")
        for name, ne, kind, offset in tensors:
            out += text(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, kind, offset)
        out += b"\0" * (-len(out) % 32) + data
        path = work / "m.gguf"
        path.write_bytes(out)
        return path

    return build


F32, NVFP4_TYPE = 0, 40

NAMES = ("blk.0.ffn_up_exps", "output_norm.weight")


def _names(hf: list[Any], dtypes: list[str] | None = None) -> dict[str, tuple[str, Any]]:
    kv: dict[str, tuple[str, Any]] = {
        "nvfp4.gguf_names": ("array", list(NAMES)),
        "nvfp4.hf_names": ("array", hf),
    }
    if dtypes is not None:
        kv["nvfp4.hf_dtypes"] = ("array", dtypes)
    return kv


def _hf(flavour: str, mutate: Callable[[Path], Any]) -> Callable[[Path, dict[str, Path]], Path]:
    def build(work: Path, good: dict[str, Path]) -> Path:
        ck = work / "ckpt"
        shutil.copytree(good[flavour], ck)
        mutate(ck)
        return ck

    return build


def _outside_index(ck: Path, target: str) -> None:
    outside = ck.parent.parent / "outside"
    shutil.copy(ck / ST, outside / "stolen.safetensors")
    with SafetensorsFile(ck / ST) as f:
        names = f.names()
    wm = {n: ST for n in names}
    wm[f"{Q}.weight"] = target.format(outside=outside)
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))


def _symlink(name: str, target: str) -> Callable[[Path], None]:
    def mutate(ck: Path) -> None:
        path = ck / name
        if path.exists():
            path.unlink()
        path.symlink_to(target.format(outside=ck.parent.parent / "outside"))

    return mutate


def _scale(value: Any, dtype: Any = np.float32) -> Callable[[Path], None]:
    def mutate(ck: Path) -> None:
        _tensors(ck, lambda t: t.__setitem__(f"{Q}.input_scale", np.asarray(value, dtype=dtype)))

    return mutate


TO = ["--to", "mlx"]
# (case, defect class, builder, command: "inspect" or convert arguments)
CASES: list[tuple[str, str, Any, list[str] | str]] = [
    # 1. reads outside the checkpoint
    (
        "extra file symlink out",
        "1",
        _hf("modelopt", _symlink("notes.txt", "{outside}/secret.txt")),
        TO,
    ),
    (
        "extra file -> /proc/self/environ",
        "1",
        _hf("modelopt", _symlink("notes.txt", "/proc/self/environ")),
        TO,
    ),
    (
        "shard symlink out",
        "1",
        _hf("modelopt", _symlink(ST, "{outside}/stolen.safetensors")),
        "inspect",
    ),
    (
        "config symlink",
        "1",
        _hf("modelopt", _symlink("config.json", "{outside}/secret.txt")),
        "inspect",
    ),
    (
        "index absolute path",
        "1",
        _hf("modelopt", lambda ck: _outside_index(ck, "{outside}/stolen.safetensors")),
        "inspect",
    ),
    (
        "index ../",
        "1",
        _hf("modelopt", lambda ck: _outside_index(ck, "../../outside/stolen.safetensors")),
        TO,
    ),
    # 3. tracebacks
    (
        "config.json nested 1000",
        "3",
        _hf("modelopt", lambda ck: _raw_json(ck / "config.json", DEEP)),
        "inspect",
    ),
    (
        "hf_quant nested 1000",
        "3",
        _hf("modelopt", lambda ck: _raw_json(ck / "hf_quant_config.json", '{"a":' + DEEP + "}")),
        "inspect",
    ),
    (
        "index nested 1000",
        "3",
        _hf("modelopt", lambda ck: _raw_json(ck / "model.safetensors.index.json", DEEP)),
        "inspect",
    ),
    (
        "header nested 1000",
        "3",
        _hf("modelopt", lambda ck: _header(ck, raw=DEEP.encode())),
        "inspect",
    ),
    (
        "5000-digit integer",
        "3",
        _hf(
            "modelopt",
            lambda ck: _raw_json(ck / "config.json", '{"hidden_size": ' + "9" * 5000 + "}"),
        ),
        "inspect",
    ),
    (
        "quantization a string",
        "3",
        _hf(
            "modelopt",
            lambda ck: _json(
                ck / "hf_quant_config.json", lambda d: d.__setitem__("quantization", "NVFP4")
            ),
        ),
        "inspect",
    ),
    (
        "quantized_layers a list",
        "3",
        _hf(
            "modelopt",
            lambda ck: _json(
                ck / "hf_quant_config.json",
                lambda d: d["quantization"].update(
                    quant_algo="MIXED_PRECISION", quantized_layers=[1]
                ),
            ),
        ),
        "inspect",
    ),
    (
        "config_groups a list",
        "3",
        _hf(
            "compressed-tensors",
            lambda ck: _json(
                ck / "config.json",
                lambda d: d["quantization_config"].__setitem__("config_groups", [1]),
            ),
        ),
        "inspect",
    ),
    (
        # found by test_fuzz.py (NVFP4_FUZZ_SEED=2, compressed-tensors example 972): an
        # internal error "unhashable type: 'list'"
        "config_groups format a list",
        "3",
        _hf(
            "compressed-tensors",
            lambda ck: _json(
                ck / "config.json",
                lambda d: d["quantization_config"]["config_groups"]["group_0"].__setitem__(
                    "format", [64, 4]
                ),
            ),
        ),
        "inspect",
    ),
    (
        "shape [0, 2**63+5]",
        "3",
        _hf(
            "modelopt",
            lambda ck: _header(
                ck,
                lambda h: h.__setitem__(
                    "z", {"dtype": "F32", "shape": [0, 2**63 + 5], "data_offsets": [0, 0]}
                ),
            ),
        ),
        "inspect",
    ),
    *[
        (
            f"gguf {key} {value!r}",
            "3",
            _hf(
                "modelopt",
                lambda ck, k=key, v=value: _json(ck / "config.json", lambda d: d.__setitem__(k, v)),
            ),
            ["--to", "gguf"],
        )
        for key, value in (
            ("hidden_size", -1),
            ("hidden_size", 2**40),
            ("hidden_size", 1.5),
            ("num_hidden_layers", "abc"),
            ("num_hidden_layers", [2]),
            ("rms_norm_eps", -1),
            ("rms_norm_eps", 3.4028235677973366e38),  # above float32's largest: F32 in GGUF
            ("rms_norm_eps", 1e-50),  # rounds to 0 in float32
            ("rope_theta", 1e39),
        )
    ],
    (
        "gguf hidden_size NaN",
        "3",
        _hf(
            "modelopt",
            lambda ck: _raw_json(ck / "config.json", '{"model_type": "llama", "hidden_size": NaN}'),
        ),
        ["--to", "gguf"],
    ),
    (
        "mlx partitions of shape ()",
        "3",
        _hf(
            "mlx",
            lambda ck: _tensors(
                ck, lambda t: t.__setitem__(f"{Q}.partitions", np.asarray(0, np.int64))
            ),
        ),
        "inspect",
    ),
    (
        "gguf hf_names of ints",
        "3",
        _gguf_case(
            {"nvfp4.gguf_names": ("array", list(NAMES)), "nvfp4.hf_names": ("array", [1, 2])}
        ),
        "inspect",
    ),
    (
        "gguf merged name with braces",
        "3",
        _gguf_case(_names(["x.{}.{0}", "model.norm.weight"])),
        "inspect",
    ),
    (
        "gguf hf_config a list",
        "3",
        _gguf_case({"nvfp4.hf_config": ("string", "[1, 2]")}),
        "inspect",
    ),
    # 4. time and memory
    (
        "shape [1] * 3e6",
        "4",
        _hf(
            "modelopt",
            lambda ck: _header(
                ck,
                lambda h: h.__setitem__(
                    "z", {"dtype": "F32", "shape": [1] * 3_000_000, "data_offsets": [0, 4]}
                ),
            ),
        ),
        "inspect",
    ),
    # 5. silently accepted lies
    (
        "missing weight_scale",
        "5",
        _hf("modelopt", lambda ck: _tensors(ck, lambda t: t.pop(f"{Q}.weight_scale"))),
        TO,
    ),
    (
        "I8 codes",
        "5",
        _hf(
            "modelopt",
            lambda ck: _tensors(
                ck, lambda t: t.__setitem__(f"{Q}.weight", t[f"{Q}.weight"].view(np.int8))
            ),
        ),
        TO,
    ),
    (
        "1-D codes",
        "5",
        _hf(
            "modelopt",
            lambda ck: _tensors(
                ck, lambda t: t.__setitem__(f"{Q}.weight", t[f"{Q}.weight"].reshape(-1))
            ),
        ),
        TO,
    ),
    (
        "4-D codes",
        "5",
        _hf(
            "modelopt",
            lambda ck: _tensors(
                ck, lambda t: t.__setitem__(f"{Q}.weight", t[f"{Q}.weight"].reshape(1, 1, 64, 32))
            ),
        ),
        TO,
    ),
    *[
        (f"input_scale {v}", "5", _hf("modelopt", _scale(v)), TO)
        for v in (np.nan, -3.0, 0.0, np.inf)
    ],
    ("input_scale I32", "5", _hf("modelopt", _scale(1, np.int32)), TO),
    (
        "ct input_global_scale NaN",
        "5",
        _hf(
            "compressed-tensors",
            lambda ck: _tensors(
                ck,
                lambda t: t.__setitem__(
                    f"{Q}.input_global_scale", np.asarray([np.nan], np.float32)
                ),
            ),
        ),
        TO,
    ),
    (
        "empty weight_map",
        "5",
        _hf(
            "modelopt",
            lambda ck: (ck / "model.safetensors.index.json").write_text('{"weight_map": {}}'),
        ),
        TO,
    ),
    (
        "mlx group_size 32",
        "5",
        _hf(
            "mlx",
            lambda ck: _json(
                ck / "config.json", lambda d: d["quantization"].__setitem__("group_size", 32)
            ),
        ),
        "inspect",
    ),
    (
        "mlx bits 8",
        "5",
        _hf(
            "mlx",
            lambda ck: _json(
                ck / "config.json", lambda d: d["quantization"].__setitem__("bits", 8)
            ),
        ),
        "inspect",
    ),
    ("gguf duplicated hf_names", "5", _gguf_case(_names(["x.{}.y", "x.{}.y"])), "inspect"),
    ("gguf scale [1] for 2 experts", "5", _gguf_case({}, scale_n=1), "inspect"),
    (
        "gguf overlapping tensor data",
        "5",
        _raw_gguf([("a.weight", [8], F32, 0), ("b.weight", [8], F32, 0)], bytes(64)),
        "inspect",
    ),
    (
        "gguf NVFP4 on a 1-D tensor",
        "3",
        _raw_gguf([("a.weight", [64], NVFP4_TYPE, 0)], bytes(64)),
        "inspect",
    ),
    ("gguf ne [2^62, 0]", "3", _raw_gguf([("a.weight", [2**62, 0], F32, 0)], bytes(32)), "inspect"),
    (
        "gguf NVFP4 experts E = 0",
        "5",
        _raw_gguf([("blk.0.ffn_up_exps.weight", [64, 64, 0], NVFP4_TYPE, 0)], bytes(32)),
        "inspect",
    ),
    (
        "gguf hf_dtypes I8 on F32",
        "5",
        _gguf_case(_names(["x.{}.y", "model.norm.weight"], ["", "I8"])),
        "inspect",
    ),
]


@pytest.mark.parametrize(("case", "defect", "build", "command"), CASES, ids=[c[0] for c in CASES])
def test_hostile_checkpoint_is_a_clean_refusal(
    tmp_path: Path, good: dict[str, Path], case: str, defect: str, build: Any, command: Any
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    (tmp_path / "dst").mkdir()
    src = (
        build(tmp_path / "src", good)
        if build.__code__.co_argcount == 2
        else build(tmp_path / "src")
    )
    dst = tmp_path / "dst" / "out"
    argv = (
        ["inspect", str(src)] if command == "inspect" else ["convert", str(src), str(dst), *command]
    )
    before = tree_hash(src)
    outcome = run_guarded(argv)
    assert_clean_refusal(
        outcome, source=src, source_hash=before, work=tmp_path, what=f"{case} (class {defect})"
    )


# ================================================================== data loss (class 2)
@pytest.mark.parametrize("where", ["same", "inside", "parent", "grandparent"])
def test_destination_overlapping_the_source_is_refused(
    tmp_path: Path, good: dict[str, Path], where: str
) -> None:
    src = tmp_path / "p" / "m" / "src"
    shutil.copytree(good["modelopt"], src)
    (tmp_path / "p" / "sibling.txt").write_text("mine\n")
    dst = {
        "same": src,
        "inside": src / ST,
        "parent": src.parent,
        "grandparent": tmp_path / "p",
    }[where]
    before = tree_hash(tmp_path / "p")
    to = "gguf" if where == "inside" else "mlx"
    outcome = run_guarded(["convert", str(src), str(dst), "--to", to, "--force"])
    assert outcome.status == 2, outcome.stderr
    assert "destination" in outcome.stderr
    assert tree_hash(tmp_path / "p") == before


def test_force_replaces_only_a_checkpoint(tmp_path: Path, good: dict[str, Path]) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"\xff\xd8")
    before = tree_hash(photos)
    outcome = run_guarded(["convert", str(good["modelopt"]), str(photos), "--to", "mlx", "--force"])
    assert outcome.status == 2, outcome.stderr
    assert "not a checkpoint" in outcome.stderr
    assert tree_hash(photos) == before
    (tmp_path / "empty").mkdir()
    assert (
        run_guarded(
            ["convert", str(good["modelopt"]), str(tmp_path / "empty"), "--to", "mlx", "--force"]
        ).status
        == 0
    )
    old = tmp_path / "old"
    shutil.copytree(good["compressed-tensors"], old)
    assert (
        run_guarded(["convert", str(good["modelopt"]), str(old), "--to", "mlx", "--force"]).status
        == 0
    )
    assert json.loads((old / "config.json").read_text())["quantization"]["mode"] == "nvfp4"


def test_destination_appearing_during_the_run_is_not_replaced(
    tmp_path: Path, good: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvfp4_checkpoints import hf

    dst = tmp_path / "out"
    real = hf._write_hf

    def racing(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        dst.mkdir()
        (dst / "theirs.txt").write_text("someone else's\n")

    monkeypatch.setattr(hf, "_write_hf", racing)
    outcome = run_guarded(["convert", str(good["modelopt"]), str(dst), "--to", "mlx"])
    assert outcome.status == 2, outcome.stderr
    assert "appeared" in outcome.stderr
    assert sorted(os.listdir(dst)) == ["theirs.txt"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def _flip_a_code_byte(out: Path) -> str:
    """XOR one byte of the first NVFP4 codes in a written output with 0x77 (two different
    E2M1 codes, still valid: only a comparison sees it); the name of the tensor hit (its
    prefix; the GGUF name for a GGUF output)."""
    if out.is_file():
        import gguf

        reader = gguf.GGUFReader(out)
        hit = next(t for t in reader.tensors if int(t.tensor_type) == 40)
        offset, name = int(hit.data_offset) + 4, str(hit.name)  # bytes 0..3: the scales
        del reader, hit
        path = out
    else:
        for path in sorted(out.glob("*.safetensors")):
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            codes = [
                (k, v)
                for k, v in header.items()
                if k != "__metadata__"
                and v["dtype"] in ("U8", "U32")
                and k.endswith((".weight", ".weight_packed"))
            ]
            if codes:
                key, info = codes[0]
                offset, name = 8 + n + info["data_offsets"][0], key.rpartition(".")[0]
                break
        else:
            raise AssertionError(f"no NVFP4 codes in {out}")
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x77]))
    return name


@pytest.mark.parametrize("to", ["modelopt", "compressed-tensors", "mlx", "gguf"])
def test_convert_refuses_an_output_that_does_not_read_back_as_its_source(
    tmp_path: Path, good: dict[str, Path], monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    """The round-trip invariant: a writer that corrupts one tensor's bytes makes convert
    exit 2 naming that tensor and what differs, with no output left (the temporary removed,
    DST never created)."""
    import dataclasses

    from nvfp4_checkpoints.api import FLAVOUR_IO

    io = FLAVOUR_IO[to]
    hit: list[str] = []

    def corrupting(tmp: Path, src: Any, options: Any) -> list[str]:
        notes = io.write(tmp, src, options)
        hit.append(_flip_a_code_byte(tmp))
        return notes

    monkeypatch.setitem(FLAVOUR_IO, to, dataclasses.replace(io, write=corrupting))
    src = good["modelopt"]
    (tmp_path / "dst").mkdir()
    before = tree_hash(src)
    outcome = run_guarded(["convert", str(src), str(tmp_path / "dst" / "out"), "--to", to])
    assert_clean_refusal(outcome, source=src, source_hash=before, work=tmp_path, what=to)
    (name,) = hit
    if to != "gguf":
        assert f"tensor {name!r}: codes differ at (" in outcome.stderr, outcome.stderr
    else:
        assert "codes differ at (" in outcome.stderr, outcome.stderr
    assert "does not read back as its source" in outcome.stderr


def test_a_killed_replace_is_restored_never_deleted(
    tmp_path: Path, good: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    from nvfp4_checkpoints.destination import OLD_MARK, RUN_MARK

    dst = tmp_path / "out"
    shutil.copytree(good["mlx"], dst)
    before = tree_hash(dst)
    old = tmp_path / f".out{OLD_MARK}999999.abcd"
    dst.rename(old)  # what a kill between the two renames leaves
    marker = tmp_path / f".out{RUN_MARK}999999.abcd"
    marker.write_text(
        json.dumps(
            {"pid": 2**22 + 7, "start": "1", "tmp": ".out.nvfp4-tmp.999999.abcd", "old": old.name}
        )
    )
    stranger = tmp_path / ".out.nvfp4-tmp.1.ffff"  # no marker: not ours
    stranger.mkdir()
    outcome = run_guarded(["convert", str(good["modelopt"]), str(dst), "--to", "mlx"])
    assert outcome.status == 2  # restored, so it exists
    assert "already exists" in outcome.stderr
    assert tree_hash(dst) == before
    assert "restored" in caplog.text
    assert "no marker" in caplog.text
    assert sorted(os.listdir(tmp_path)) == sorted(["out", stranger.name])


def test_inspect_json_is_valid_json_when_a_fused_member_fails(
    tmp_path: Path, good: dict[str, Path]
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(good["modelopt"], ck)

    def poison(t: dict[str, np.ndarray]) -> None:
        t[f"{K}.weight_scale_2"] = np.asarray(np.nan, np.float32)

    _tensors(ck, poison)
    outcome = run_guarded(["inspect", str(ck), "--json"])
    assert outcome.status == 2
    report = json.loads(outcome.stdout, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert report["fused_groups"][0]["max_ratio"] is None


def test_a_config_promising_layers_the_tensors_lack_is_refused_at_once(
    tmp_path: Path, good: dict[str, Path]
) -> None:
    """Config values are bounded by what the tensors present can need: 100,000 layers in
    config.json against one in the tensors is refused before any cost, in one line."""
    pytest.importorskip("gguf")
    ck = tmp_path / "ck"
    shutil.copytree(good["modelopt"], ck)
    _json(ck / "config.json", lambda d: d.__setitem__("num_hidden_layers", 100_000))
    outcome = run_guarded(["convert", str(ck), str(tmp_path / "o.gguf"), "--to", "gguf"])
    assert outcome.status == 2, outcome.stderr
    assert "num_hidden_layers: expected 1 (the layers the tensors hold), found 100000" in (
        outcome.stderr
    )
    assert outcome.seconds < 20
    assert outcome.peak < 256 * 2**20
    assert not (tmp_path / "o.gguf").exists()


def test_many_zero_byte_tensors_inspect_in_linear_time(
    tmp_path: Path, good: dict[str, Path]
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(good["modelopt"], ck)
    entries = {
        f"z.{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(100_000)
    }
    _header(ck, lambda h: h.update(entries))
    outcome = run_guarded(["inspect", str(ck)])
    assert outcome.status == 0, outcome.stderr
    assert outcome.seconds < 30, outcome.seconds


def _big_sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk, no time


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (lambda p: p.write_text(DEEP), "JSON nested 1000 levels deep, more than the 64 read"),
        (
            lambda p: _big_sparse(p, 100_000_001),
            "JSON of 100000001 bytes, more than the 100000000 read",
        ),
    ],
    ids=["nested 1000", "over 100 MB"],
)
def test_a_hostile_tokenizer_json_meets_the_json_limits(
    tmp_path: Path, good: dict[str, Path], write: Callable[[Path], None], said: str
) -> None:
    """The GGUF output reads the source's tokenizer.json within the limits of every JSON
    read: refused before parsing, in one line naming the file."""
    pytest.importorskip("gguf")
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    write(ck / "tokenizer.json")
    before = tree_hash(ck)
    outcome = run_guarded(["convert", str(ck), str(tmp_path / "dst" / "o.gguf"), "--to", "gguf"])
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what="tokenizer")
    assert f"{ck / 'tokenizer.json'}: {said}" in outcome.stderr


@pytest.mark.parametrize("shard", [".", "./", "sub"])
@pytest.mark.parametrize("command", ["inspect", "convert", "verify"])
def test_an_index_naming_a_directory_is_a_clean_refusal(
    tmp_path: Path, good: dict[str, Path], shard: str, command: str
) -> None:
    """A weight_map entry naming a directory (the folder itself, ``.``, included) is
    refused where the index is read: the file, the key, expected a file, found a directory."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    (ck / "sub").mkdir()
    with SafetensorsFile(ck / ST) as f:
        weight_map = dict.fromkeys(f.names(), ST)
    weight_map["model.norm.weight"] = shard
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    argv = {
        "inspect": ["inspect", str(ck)],
        "convert": ["convert", str(ck), str(tmp_path / "dst" / "o"), "--to", "mlx"],
        "verify": ["verify", str(good["modelopt"]), str(ck)],
    }[command]
    before = tree_hash(ck)
    outcome = run_guarded(argv)
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what=shard)
    assert_names(
        outcome.stderr,
        ck,
        f"model.safetensors.index.json: key 'weight_map.model.norm.weight': shard {shard!r}: "
        "expected a regular file",
    )
    assert "found a directory" in outcome.stderr


def _split_shards(ck: Path, a_holds: set[str], b_holds: set[str], index: dict[str, str]) -> None:
    """``ck``'s one file split into shards ``a`` and ``b`` holding the tensors named, with an
    index mapping every tensor to ``a`` except those ``index`` maps elsewhere (``""``: no
    entry)."""
    with SafetensorsFile(ck / ST) as f:
        arrays = {n: np.array(f.get(n)) for n in f.names()}
    (ck / ST).unlink()
    save_file(ck / "a.safetensors", {n: arrays[n] for n in sorted(a_holds)})
    save_file(ck / "b.safetensors", {n: arrays[n] for n in sorted(b_holds)})
    weight_map = dict.fromkeys(arrays, "a.safetensors")
    weight_map.update(index)
    weight_map = {n: f for n, f in weight_map.items() if f}
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


NORM = "model.norm.weight"
X = f"{V}.input_scale"  # a tensor that b.safetensors holds and the index maps to it


@pytest.mark.parametrize(
    ("a_not", "b_holds", "index", "said"),
    [
        (
            {NORM, X},
            {NORM, X},
            {NORM: "", X: "b.safetensors"},
            "model.safetensors.index.json: shard 'b.safetensors' holds tensor "
            f"'{NORM}': expected 'weight_map' to map it to 'b.safetensors', found no entry",
        ),
        (
            {X},
            {NORM, X},
            {X: "b.safetensors"},
            "model.safetensors.index.json: shard 'b.safetensors' holds tensor "
            f"'{NORM}': expected 'weight_map' to map it to 'b.safetensors', found an entry "
            "naming 'a.safetensors'",
        ),
        (
            {NORM, X},
            {X},
            {NORM: "b.safetensors", X: "b.safetensors"},
            f"model.safetensors.index.json: tensor '{NORM}' is mapped to 'b.safetensors', which "
            "does not hold it",
        ),
    ],
    ids=["a shard tensor without an entry", "a shard tensor mapped elsewhere", "an entry lacking"],
)
def test_index_and_shards_agree_both_ways(
    tmp_path: Path,
    good: dict[str, Path],
    a_not: set[str],
    b_holds: set[str],
    index: dict[str, str],
    said: str,
) -> None:
    """No tensor is silently dropped or taken from a shard the index does not name for it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    with SafetensorsFile(ck / ST) as f:
        names = set(f.names())
    _split_shards(ck, names - a_not, b_holds, index)
    before = tree_hash(ck)
    outcome = run_guarded(["convert", str(ck), str(tmp_path / "dst" / "o"), "--to", "mlx"])
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what=said)
    assert said in outcome.stderr


def test_a_gguf_of_ours_without_a_global_is_refused(tmp_path: Path) -> None:
    """Our writer writes every ``.scale``: in a file recording nvfp4.spec_version a missing
    one is refused naming the tensor, not read as 1.0 (what it means in a foreign file, as
    ``test_gguf_written_by_gguf_py_itself`` checks)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    src = _gguf_case({"nvfp4.spec_version": ("string", "1.1")}, scale_n=0)(tmp_path / "src")
    before = tree_hash(src)
    outcome = run_guarded(["inspect", str(src)])
    assert_clean_refusal(outcome, source=src, source_hash=before, work=tmp_path, what="no .scale")
    assert_names(
        outcome.stderr,
        src,
        "NVFP4 tensor 'blk.0.ffn_up_exps.weight': expected its global "
        "'blk.0.ffn_up_exps.scale' (a file recording nvfp4.spec_version holds every global), "
        "found none",
    )


def _gguf_llama(
    kv: dict[str, tuple[str, Any]], embd: Any = None, embd_type: Any = None
) -> Callable[[Path], Path]:
    """A llama GGUF with an NVFP4 ``attn_q`` of 64 rows (RoPE-permuted by its head count)
    and a token embedding of 32 x 64 (F32 unless ``embd`` / ``embd_type`` say otherwise)."""

    def build(work: Path) -> Path:
        gguf = pytest.importorskip("gguf")
        rng = np.random.default_rng(2)
        data, scale = to_gguf(quantize(rng.standard_normal((64, 64)).astype(np.float32)))
        e = embd if embd is not None else rng.standard_normal((32, 64)).astype(np.float32)
        path = work / "m.gguf"
        _gguf(
            path,
            kv={"llama.embedding_length": ("uint32", 64), **kv},
            tensors=[
                ("blk.0.attn_q.weight", data, gguf.GGMLQuantizationType.NVFP4),
                ("blk.0.attn_q.scale", np.resize(scale, 1).astype(np.float32)),
                ("token_embd.weight", e, *([embd_type] if embd_type is not None else [])),
                ("output_norm.weight", np.ones(64, np.float32)),
            ],
        )
        return path

    return build


HEADS = "llama.attention.head_count"
HF_CONFIG = "nvfp4.hf_config"


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (_gguf_llama({HEADS: ("uint32", 0)}), f"{HEADS}: expected an integer in [1, "),
        (_gguf_llama({HEADS: ("int32", -4)}), f"{HEADS}: expected an integer in [1, "),
        (_gguf_llama({HEADS: ("string", "4")}), f"{HEADS}: expected an integer in [1, "),
        (_gguf_llama({HEADS: ("bool", True)}), f"{HEADS}: expected an integer in [1, "),
        (
            _gguf_llama({HEADS: ("uint32", 4), f"{HEADS}_kv": ("uint32", 3)}),
            f"{HEADS}_kv: expected a divisor of {HEADS} = 4, found 3",
        ),
        (
            _gguf_llama({HEADS: ("uint32", 4), f"{HEADS}_kv": ("int32", 0)}),
            f"{HEADS}_kv: expected an integer in [1, 4], found 0",
        ),
        (
            _gguf_llama({HEADS: ("uint32", 3)}),
            "tensor 'blk.0.attn_q.weight': expected rows a multiple of 2 x 3 heads",
        ),
        (
            _gguf_llama(
                {HEADS: ("uint32", 4), HF_CONFIG: ("string", '{"num_attention_heads": 8}')}
            ),
            f"{HEADS}: expected 8 (config.json's num_attention_heads, {HF_CONFIG}), found 4",
        ),
        (
            _gguf_llama({HF_CONFIG: ("string", '{"num_attention_heads": 4}')}),
            f"{HEADS}: expected 4 (config.json's num_attention_heads), found None",
        ),
        (
            _gguf_llama({}, embd=np.ones((32, 64), np.int16)),
            "tensor 'token_embd.weight': expected a float type (F32, F16, BF16, F64), found I16",
        ),
        (
            _gguf_llama({}, embd=np.ones((32, 64), np.int8)),
            "tensor 'token_embd.weight': expected a float type (F32, F16, BF16, F64), found I8",
        ),
        (
            _gguf_llama({"llama.vocab_size": ("uint32", 48)}),
            "tensor 'token_embd.weight': expected shape [48 x 64] (vocab size x hidden size), "
            "found [32, 64]",
        ),
        (
            _gguf_llama({HF_CONFIG: ("string", '{"vocab_size": 31}')}),
            "tensor 'token_embd.weight': expected shape [31 x 64]",
        ),
        (
            _gguf_llama({"llama.embedding_length": ("uint32", 0)}),
            "llama.embedding_length: expected an integer in [1, ",
        ),
        (
            _gguf_llama({"llama.vocab_size": ("string", "32")}),
            "llama.vocab_size: expected an integer in [1, ",
        ),
    ],
    ids=[
        "head_count 0",
        "head_count -4",
        "head_count a string",
        "head_count a bool",
        "head_count_kv 3 of 4",
        "head_count_kv 0",
        "head_count 3 for 64 rows",
        "head_count against the config",
        "head_count missing, the config has it",
        "embedding I16",
        "embedding I8",
        "embedding rows against vocab_size",
        "embedding rows against the config",
        "embedding_length 0",
        "vocab_size a string",
    ],
)
def test_gguf_counts_are_checked_against_the_tensors_and_the_config(
    tmp_path: Path, build: Callable[[Path], Path], said: str
) -> None:
    """A head count or vocabulary size that is not a positive integer, disagrees with the
    recorded config or with the tensors, or an embedding of an integer type, is refused
    where it is read, naming the file and the key or tensor: before, a head count of 0, -4
    or "4" was read as absent (the q / k rows left RoPE-permuted: silently wrong weights)
    and an I16 embedding was converted as one."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    src = build(tmp_path / "src")
    before = tree_hash(src)
    for argv in (
        ["inspect", str(src)],
        ["convert", str(src), str(tmp_path / "dst" / "o"), "--to", "modelopt"],
    ):
        outcome = run_guarded(argv)
        assert_clean_refusal(outcome, source=src, source_hash=before, work=tmp_path, what=said)
        assert f"nvfp4: error: {src}: " in outcome.stderr, outcome.stderr
        assert said in outcome.stderr, outcome.stderr


def test_a_valid_llama_gguf_is_read_with_its_heads(tmp_path: Path) -> None:
    """The builder above makes a valid file when its counts are right: the refusals are the
    counts' doing."""
    src = _gguf_llama(
        {
            HEADS: ("uint32", 4),
            f"{HEADS}_kv": ("uint32", 2),
            "llama.vocab_size": ("uint32", 32),
            HF_CONFIG: ("string", '{"num_attention_heads": 4, "vocab_size": 32}'),
        },
        embd=np.ones((32, 64), np.float16),
    )(tmp_path)
    outcome = run_guarded(["inspect", str(src)])
    assert outcome.status == 0, outcome.stderr


SECRET_TEMPLATE = "{{ 'the secret chat template' }}"


@pytest.mark.parametrize("via", ["source", "--tokenizer"])
@pytest.mark.parametrize("linked", ["tokenizer.json", "chat_template.jinja"])
@pytest.mark.parametrize("to", ["modelopt", "compressed-tensors", "mlx", "gguf"])
def test_an_auxiliary_file_linked_outside_is_refused_by_every_output(
    tmp_path: Path, good: dict[str, Path], to: str, linked: str, via: str
) -> None:
    """A tokenizer file or chat template that is a symlink out of the source checkpoint (or
    out of a ``--tokenizer`` folder) is refused by every output flavour, before anything is
    written: none reads it, none copies its bytes."""
    if to == "gguf":
        pytest.importorskip("gguf")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (outside / "chat_template.jinja").write_text(SECRET_TEMPLATE)
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["mlx" if to == "modelopt" else "modelopt"], ck)
    tok = ck / "tok" if via == "--tokenizer" else ck
    tok.mkdir(exist_ok=True)
    (tok / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "ab"}))
    (tok / linked).unlink(missing_ok=True)
    (tok / linked).symlink_to(outside / linked)
    dst = tmp_path / "dst" / ("o.gguf" if to == "gguf" else "o")
    extra = ["--tokenizer", str(tok)] if via == "--tokenizer" else []
    before = tree_hash(ck)
    outcome = run_guarded(["convert", str(ck), str(dst), "--to", to, *extra])
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what=linked)
    assert_names(outcome.stderr, tok, f"file '{linked}': is a symlink")


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (
            b'{"__metadata__": {"note": "' + b"x" * 30_000_000 + b'"}}',
            "__metadata__ 'note': expected at most 1048576 characters per key and value, "
            "found 30000000",
        ),
        (
            b"{" + b",".join(b'"k%d": 0' % i for i in range(1_000_000)) + b"}",
            "header: a JSON object of 1000000 keys, more than the 131073 read",
        ),
        (
            b'{"z": {"dtype": "F32", "shape": ['
            + b"1," * 3_000_000
            + b'1], "data_offsets": [0, 4]}}',
            "header: JSON of 3000007 separators (',' and ':'), more than the 2097152 read",
        ),
    ],
    ids=["30 MB metadata string", "a million keys", "3 million values"],
)
def test_a_costly_header_is_refused_before_it_costs(
    tmp_path: Path, good: dict[str, Path], header: bytes, said: str
) -> None:
    """Header size, tensors, values and metadata strings are bounded: a hostile header
    within the 32 MiB read is refused in well under a second, in one line."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    _header(ck, raw=header)
    before = tree_hash(ck)
    outcome = run_guarded(["inspect", str(ck)])
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what=said)
    assert said in outcome.stderr
    assert outcome.seconds < 1.0, outcome.seconds


def test_an_oversized_chat_template_is_refused_before_it_is_read(
    tmp_path: Path, good: dict[str, Path]
) -> None:
    """The text files the GGUF tokenizer reads whole (chat templates, merges) are bounded
    like JSON: a 100 MB template is refused naming it, not read into the GGUF."""
    pytest.importorskip("gguf")
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    ck = tmp_path / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    (ck / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (ck / "tokenizer_config.json").write_text(json.dumps({"eos_token": "ab"}))
    _big_sparse(ck / "chat_template.jinja", 100_000_001)
    before = tree_hash(ck)
    outcome = run_guarded(["convert", str(ck), str(tmp_path / "dst" / "o.gguf"), "--to", "gguf"])
    assert_clean_refusal(outcome, source=ck, source_hash=before, work=tmp_path, what="template")
    assert (
        f"{ck / 'chat_template.jinja'}: a tokenizer file of 100000001 bytes, more than the "
        "100000000 read"
    ) in outcome.stderr


# ====================================================================== Hypothesis fuzz
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=2**64), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
_HEADER_KEYS = st.sampled_from(["dtype", "shape", "data_offsets"])
_CONFIG_KEYS = st.sampled_from(
    [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "rope_theta",
        "model_type",
        "quantization_config",
        "vocab_size",
    ]
)


@settings(
    max_examples=int(os.environ.get("NVFP4_FUZZ_EXAMPLES", "60")),
    derandomize=os.environ.get("NVFP4_FUZZ_EXAMPLES") is None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    target=st.sampled_from(["header", "config", "hf_quant"]),
    tensor=st.sampled_from(
        [f"{Q}.weight", f"{Q}.weight_scale", f"{Q}.weight_scale_2", f"{Q}.input_scale"]
    ),
    header_key=_HEADER_KEYS,
    config_key=_CONFIG_KEYS,
    value=_VALUES,
    to=st.sampled_from(["mlx", "gguf", "compressed-tensors"]),
)
def test_fuzzed_checkpoint_is_converted_or_cleanly_refused(
    tmp_path_factory: pytest.TempPathFactory,
    good: dict[str, Path],
    target: str,
    tensor: str,
    header_key: str,
    config_key: str,
    value: Any,
    to: str,
) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    ck = work / "src" / "ck"
    shutil.copytree(good["modelopt"], ck)
    (work / "dst").mkdir()
    if target == "header":
        _header(ck, lambda h: h[tensor].__setitem__(header_key, value))
    elif target == "config":
        _json(ck / "config.json", lambda d: d.__setitem__(config_key, value))
    else:
        _json(
            ck / "hf_quant_config.json",
            lambda d: d["quantization"].__setitem__("quant_algo", value),
        )
    before = tree_hash(ck)
    dst = work / "dst" / ("out.gguf" if to == "gguf" else "out")
    outcome = run_guarded(["convert", str(ck), str(dst), "--to", to])
    FUZZ_FIGURES.append((outcome.status, outcome.error is not None, outcome.seconds, outcome.peak))
    if outcome.status == 0 and outcome.error is None:
        assert tree_hash(ck) == before
        return
    assert_clean_refusal(
        outcome,
        source=ck,
        source_hash=before,
        work=work,
        what=f"{target} {tensor} {header_key} {config_key} = {value!r}",
    )


FUZZ_FIGURES: list[tuple[int | None, bool, float, int]] = []


def test_a_deep_folder_does_not_push_the_found_value_off_the_line() -> None:
    """An error line over the limit gives up the middle of the path it opens with first: the
    file name, the expected and the found stay whole (a test's temporary folder under
    pytest-xdist is 140 characters deep)."""
    from nvfp4_checkpoints.folder import MAX_MESSAGE, one_line

    path = "/tmp/" + "/".join(["a-rather-long-folder-name"] * 10) + "/model.safetensors.index.json"
    what = (
        ": shard 'b.safetensors' holds tensor 'w': expected 'b.safetensors', found 'a.safetensors'"
    )
    line = one_line(path + what)
    assert len(line) <= MAX_MESSAGE
    assert line.endswith("/model.safetensors.index.json" + what)
    assert line.startswith("/tmp/a-rather-lo...")
    assert one_line("/short/path: what") == "/short/path: what"
    assert one_line("x" * 400).endswith("...")
