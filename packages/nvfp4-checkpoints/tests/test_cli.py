"""The ``nvfp4`` CLI: inspect, convert (progress, atomicity, kills), verify, exit codes."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from make_modelopt_exports import session_exports
from nvfp4 import quantize
from nvfp4_checkpoints import open_checkpoint, write_checkpoint
from nvfp4_checkpoints.cli import main
from nvfp4_checkpoints.destination import TMP_MARK

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="session")
def modelopt_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return session_exports(tmp_path_factory)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvfp4_checkpoints.cli", *args],
        capture_output=True,
        text=True,
        env=_env(env),
        timeout=120,
    )


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def _assert_bad_input(r: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    # one line of reason, last; anything before it is the progress bar
    assert lines[-1].startswith("nvfp4: error: "), lines[-1]
    assert fragment in lines[-1], lines[-1]
    assert all(line.startswith("[") for line in lines[:-1]), r.stderr
    assert "Traceback" not in r.stderr


def _leftovers(parent: Path, name: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(f".{name}{TMP_MARK}")]


def test_inspect_text_and_json(
    modelopt_exports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    moe = modelopt_exports["moe"]
    assert main(["inspect", str(moe), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    with open_checkpoint(moe) as ck:
        assert report["flavour"] == "modelopt"
        assert report["quantized"]["count"] == len(ck.quantized_names()) == 32
        assert report["other_tensors"]["count"] == len(ck.tensor_names())
        globals_ = [float(ck.planes(n).global_scale) for n in ck.quantized_names()]
        assert report["quantized"]["global_scale"] == {"min": min(globals_), "max": max(globals_)}
    assert report["validation"] == {"checked": 32, "valid": 32, "errors": []}
    assert report["expert_groups"] == {
        f"model.layers.{i}.mlp.experts.{{}}.{p}": 4
        for i in range(2)
        for p in ("down_proj", "gate_proj", "up_proj")
    }
    assert len(report["fused_groups"]) == 2 + 2 * 4  # qkv per layer, gate/up per expert
    assert all(f["max_ratio"] == 1.0 for f in report["fused_groups"])
    assert main(["inspect", str(modelopt_exports["mixed"])]) == 0
    text = capsys.readouterr().out
    assert "flavour:      modelopt" in text
    assert "NVFP4 tensors: 14" in text
    assert "input scales (decode):  8" in text  # attention NVFP4, MLP weight-only
    assert "validation: 14/14 NVFP4 tensors valid" in text


@pytest.mark.parametrize("flavour", ["modelopt", "compressed-tensors", "mlx", "gguf"])
def test_our_outputs_record_their_spec_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flavour: str
) -> None:
    """Every flavour we write records the spec version of its planes (an ``nvfp4`` block in
    the flavour's quantization config, GGUF's ``nvfp4.spec_version`` key): inspect reads it
    back instead of assuming one; a ModelOpt folder without the block is read as 1.0, and
    inspect says that is an assumption."""
    rng = np.random.default_rng(4)
    planes = {
        "model.layers.0.mlp.down_proj": quantize(rng.standard_normal((32, 64)).astype(np.float32))
    }
    dst = tmp_path / ("ck.gguf" if flavour == "gguf" else "ck")
    config = {"model_type": "llama", "num_hidden_layers": 1} if flavour == "gguf" else {}
    out = write_checkpoint(dst, planes, flavour=flavour, tensors={}, config=config)
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec_version"] == "1.0"
    if flavour == "modelopt":
        hq = json.loads((out / "hf_quant_config.json").read_text())
        assert hq["nvfp4"]["spec_version"] == "1.0"
        del hq["nvfp4"]
        (out / "hf_quant_config.json").write_text(json.dumps(hq))
        assert main(["inspect", str(out)]) == 0
        assert "spec version: 1.0 (read as; the file records none)" in capsys.readouterr().out


def test_fused_globals_that_differ_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(2)
    w = {
        f"model.layers.0.self_attn.{x}_proj": rng.standard_normal((32, 64)).astype(np.float32) * s
        for x, s in zip("qkv", (1.0, 2.5, 1.0), strict=True)
    }
    planes = {k: quantize(v, name=k) for k, v in w.items()}
    out = write_checkpoint(tmp_path / "ck", planes, flavour="modelopt", tensors={}, config={})
    assert main(["inspect", str(out), "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)["fused_groups"]
    g = [float(planes[m].global_scale) for m in group["members"]]
    assert group["max_ratio"] == pytest.approx(max(g) / min(g))
    assert group["max_ratio"] > 2.0


def test_convert_progress_force_and_result(
    modelopt_exports: dict[str, Path], tmp_path: Path
) -> None:
    dst = tmp_path / "out"
    r = _run("convert", str(modelopt_exports["llama"]), str(dst), "--to", "mlx")
    assert r.returncode == 0, r.stderr
    assert "21/21 tensors" in r.stderr
    assert "KiB" in r.stderr
    assert "wrote" in r.stderr
    assert r.stdout == ""
    again = _run("convert", str(modelopt_exports["llama"]), str(dst), "--to", "gguf")
    _assert_bad_input(again, "already exists")
    assert (dst / "model.safetensors").is_file()  # untouched
    forced = _run("convert", str(modelopt_exports["llama"]), str(dst), "--to", "gguf", "--force")
    assert forced.returncode == 0, forced.stderr
    assert dst.is_file()
    assert dst.read_bytes()[:4] == b"GGUF"
    assert _leftovers(tmp_path, "out") == []
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())
    verify = _run("verify", str(modelopt_exports["llama"]), str(dst))
    assert verify.returncode == 0, verify.stdout
    assert verify.stdout.startswith("SAME"), verify.stdout


def test_progress_bar_gives_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar shows the time left at the rate so far, then the time it took."""
    from nvfp4_checkpoints import cli

    clock = iter([100.0, 130.0, 190.0])
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = cli._Bar(out)  # starts at t = 100 s
    bar(1, 4, 250 * 2**20, 1000 * 2**20)  # t = 130: a quarter in 30 s, 90 s to go
    bar(4, 4, 1000 * 2**20, 1000 * 2**20)  # t = 190: done
    first, last = out.getvalue().splitlines()
    assert "1/4 tensors" in first
    assert first.endswith("ETA 1:30")
    assert last.endswith("1:30 elapsed")
    assert cli._eta(0.5, 0, 10) == "?"
    assert cli._clock(3725) == "1:02:05"


# ---------------------------------------------------------------------- bad input: exit 2
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".complete"))
    return dst


def _header(path: Path) -> tuple[int, dict[str, object]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8 : 8 + n])


def test_bad_inputs_exit_2_with_one_line(modelopt_exports: dict[str, Path], tmp_path: Path) -> None:
    llama = modelopt_exports["llama"]
    # missing files
    _assert_bad_input(_run("inspect", str(tmp_path / "nope")), "no such file")
    _assert_bad_input(
        _run("convert", str(tmp_path / "nope"), str(tmp_path / "o"), "--to", "mlx"),
        "no such file",
    )
    no_weights = tmp_path / "no_weights"
    _copy(llama, no_weights)
    (no_weights / "model.safetensors").unlink()
    _assert_bad_input(_run("inspect", str(no_weights)), "no *.safetensors")
    # truncated safetensors
    truncated = _copy(llama, tmp_path / "truncated")
    st = truncated / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    _assert_bad_input(_run("inspect", str(truncated)), "truncated")
    # a header that lies about its length, and one that lies about a tensor's size
    lying = _copy(llama, tmp_path / "lying")
    st = lying / "model.safetensors"
    raw = bytearray(st.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) * 2)
    st.write_bytes(bytes(raw))
    _assert_bad_input(_run("inspect", str(lying)), "runs beyond the file")
    lying2 = _copy(llama, tmp_path / "lying2")
    st = lying2 / "model.safetensors"
    n, header = _header(st)
    entry = header["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(entry, dict)
    entry["shape"] = [entry["shape"][0], entry["shape"][1] + 1]
    body = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(body) == n
    st.write_bytes(st.read_bytes()[:8] + body + st.read_bytes()[8 + n :])
    _assert_bad_input(
        _run("convert", str(lying2), str(tmp_path / "o2"), "--to", "gguf"),
        "'model.layers.0.self_attn.q_proj.weight'",
    )
    assert not (tmp_path / "o2").exists()
    # a truncated GGUF: its header, and its last tensor's data
    gguf_path = tmp_path / "m.gguf"
    assert _run("convert", str(llama), str(gguf_path), "--to", "gguf").returncode == 0
    raw = gguf_path.read_bytes()
    cut_header = tmp_path / "cut_header.gguf"
    cut_header.write_bytes(raw[:200])
    _assert_bad_input(_run("inspect", str(cut_header)), "not a readable GGUF file")
    cut_data = tmp_path / "cut_data.gguf"
    cut_data.write_bytes(raw[: len(raw) // 2])
    _assert_bad_input(_run("verify", str(llama), str(cut_data)), "(truncated?)")
    # unknown flavour
    unknown = _copy(llama, tmp_path / "unknown")
    (unknown / "hf_quant_config.json").unlink()
    cfg = json.loads((unknown / "config.json").read_text())
    del cfg["quantization_config"]
    (unknown / "config.json").write_text(json.dumps(cfg))
    _assert_bad_input(_run("inspect", str(unknown)), "unknown flavour")
    # unknown --to is argparse's exit 2 too
    r = _run("convert", str(llama), str(tmp_path / "o3"), "--to", "onnx")
    assert r.returncode == 2
    assert "invalid choice" in r.stderr


def test_malformed_planes_exit_2(modelopt_exports: dict[str, Path], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    bad = _copy(modelopt_exports["llama"], tmp_path / "bad_scale")
    path = bad / "model.safetensors"
    tensors = st_torch.load_file(str(path))
    name = "model.layers.1.mlp.up_proj.weight_scale"
    raw = tensors[name].view(torch.uint8).clone()
    raw[2, 1] = 0xFF  # a negative NaN scale byte: refused by content validation
    tensors[name] = raw.view(torch.float8_e4m3fn)
    st_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    r = _run("convert", str(bad), str(tmp_path / "o"), "--to", "compressed-tensors")
    _assert_bad_input(r, "model.layers.1.mlp.up_proj")
    assert "0xFF" in r.stderr
    assert not (tmp_path / "o").exists()
    assert _leftovers(tmp_path, "o") == []
    ins = _run("inspect", str(bad))
    assert ins.returncode == 2
    assert "validation: 13/14" in ins.stdout


def test_gguf_refuses_k_not_multiple_of_64(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    planes = {
        "model.layers.0.mlp.down_proj": quantize(
            rng.standard_normal((32, 48)).astype(np.float32), name="model.layers.0.mlp.down_proj"
        )
    }
    src = write_checkpoint(
        tmp_path / "k48",
        planes,
        flavour="modelopt",
        tensors={"model.norm.weight": np.ones(48, ml_dtypes.bfloat16)},
        config={"model_type": "llama", "num_hidden_layers": 1},
    )
    r = _run("convert", str(src), str(tmp_path / "k48.gguf"), "--to", "gguf")
    _assert_bad_input(r, "K for GGUF NVFP4: expected a multiple of 64, found K = 48")
    assert not (tmp_path / "k48.gguf").exists()
    assert _leftovers(tmp_path, "k48.gguf") == []
    ok = _run("convert", str(src), str(tmp_path / "k48_mlx"), "--to", "mlx")
    assert ok.returncode == 0, ok.stderr


# ------------------------------------------------------------------ no traceback, ever
#: Runs the CLI with ``open_checkpoint`` replaced by a function raising ``EXC``: a bug of ours.
_FAULTY_CLI = """
import sys
import nvfp4_checkpoints.cli as cli

def fault(*args, **kwargs):
    raise {exc}

cli.open_checkpoint = fault
sys.exit(cli.main(sys.argv[1:]))
"""


def _run_faulty(exc: str, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-c", _FAULTY_CLI.format(exc=exc), *args],
        capture_output=True,
        text=True,
        env=_env(env),
        timeout=120,
    )


def test_an_internal_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = _run_faulty("ZeroDivisionError('injected fault')", "inspect", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "nvfp4: internal error: ZeroDivisionError: injected fault (please report it; "
        "NVFP4_DEBUG=1 shows the traceback)"
    ], r.stderr
    debug = _run_faulty(
        "ZeroDivisionError('injected fault')", "inspect", str(tmp_path), env={"NVFP4_DEBUG": "1"}
    )
    assert debug.returncode == 2, debug.stderr
    assert debug.stderr.startswith("Traceback (most recent call last):"), debug.stderr
    assert "ZeroDivisionError: injected fault" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("nvfp4: internal error: ZeroDivisionError")


def test_an_interrupt_is_not_an_internal_error(tmp_path: Path) -> None:
    r = _run_faulty("KeyboardInterrupt", "inspect", str(tmp_path))
    assert r.returncode == 130, r.stderr
    assert r.stderr == "nvfp4: interrupted (no output was left behind)\n"


def test_a_closed_stdout_exits_141_without_a_word(tmp_path: Path) -> None:
    """``nvfp4 inspect X | head -1``: the reader gone, nothing on stderr, exit 128 + SIGPIPE
    (the pipe's reader is closed before the command starts, so that every write fails)."""
    src = _tiny_checkpoint(tmp_path)
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "nvfp4_checkpoints.cli", "inspect", str(src)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            timeout=120,
        )
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, "")


def _tiny_checkpoint(tmp_path: Path) -> Path:
    name = "model.layers.0.mlp.down_proj"
    planes = {name: quantize(np.ones((32, 64), np.float32), name=name)}
    return write_checkpoint(
        tmp_path / "tiny",
        planes,
        flavour="modelopt",
        tensors={"model.norm.weight": np.ones(64, np.float32)},
        config={"model_type": "llama", "num_hidden_layers": 1},
    )


# ------------------------------------------------------------------------------ verify
def test_verify_says_bit_identical_only_when_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "bit-identical" only when every byte, global and input scale is; within the allowed
    ulps, the verdict says which globals and input scales differ and by how much."""
    from nvfp4_checkpoints.safetensors_io import SafetensorsFile, save_file

    rng = np.random.default_rng(3)
    names = [f"model.layers.0.self_attn.{p}_proj" for p in ("q", "k", "v")]
    a = write_checkpoint(
        tmp_path / "a",
        {n: quantize(rng.standard_normal((32, 64)).astype(np.float32), name=n) for n in names},
        flavour="modelopt",
        tensors={"model.norm.weight": np.ones(64, np.float32)},
        config={"model_type": "llama", "num_hidden_layers": 1},
        input_scales=dict.fromkeys(names, 0.5),
    )
    b = tmp_path / "b"
    shutil.copytree(a, b)
    with SafetensorsFile(b / "model.safetensors") as f:
        arrays = {n: np.array(f.get(n)) for n in f.names()}
    for name, steps in ((f"{names[0]}.weight_scale_2", 2), (f"{names[1]}.input_scale", 1)):
        bits = arrays[name].view(np.int32) + steps  # steps float32 ulps up
        arrays[name] = bits.view(np.float32)
    save_file(b / "model.safetensors", arrays)

    assert main(["verify", str(a), str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out == (
        "SAME (modelopt vs modelopt): 3 NVFP4 tensors bit-identical (codes, scale bytes, "
        "globals, input scales); 1 other tensors equal\n"
    )
    assert main(["verify", str(a), str(b), "--global-ulps", "3"]) == 0
    out = capsys.readouterr().out
    assert out == (
        "SAME (modelopt vs modelopt): 3 NVFP4 tensors with bit-identical codes and scale "
        "bytes, not bit-identical: 1 globals up to 2 ulp apart and 1 input scales up to 1 ulp "
        "apart (within the 3 allowed); 1 other tensors equal\n"
    )
    assert "bit-identical (codes" not in out
    assert main(["verify", str(a), str(b)]) == 1  # 0 ulps allowed between two ModelOpt
    out = capsys.readouterr().out
    assert out.startswith("DIFFER (modelopt vs modelopt): tensor "), out
    assert out.endswith(" ulp apart, 0 allowed)\n"), out


# ------------------------------------------------------------------ interrupts and kills
def _sigint_default() -> None:
    """In the child before it execs: SIGINT back to its default. A test run started as a
    background job of a non-interactive shell inherits SIGINT ignored, and Python keeps an
    ignored SIGINT ignored, so the convert would never see the interrupt under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_slow_convert(src: Path, dst: Path, to: str = "modelopt") -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "nvfp4_checkpoints.cli", "convert", str(src), str(dst), "--to", to],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env({"NVFP4_TEST_SLOW_CONVERT": "0.05"}),
        preexec_fn=_sigint_default,
    )
    deadline = time.monotonic() + 60
    while not _leftovers(dst.parent, dst.name):  # wait until it is writing
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.2)
    return p


@pytest.mark.parametrize("to", ["modelopt", "gguf"])  # gguf: with its writer thread
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_nothing(
    modelopt_exports: dict[str, Path], tmp_path: Path, sig: signal.Signals, to: str
) -> None:
    dst = tmp_path / "dst"
    p = _start_slow_convert(modelopt_exports["llama"], dst, to)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_sigkill_leaves_no_dst_and_the_next_run_cleans_up(
    modelopt_exports: dict[str, Path], tmp_path: Path
) -> None:
    dst = tmp_path / "dst"
    p = _start_slow_convert(modelopt_exports["llama"], dst)
    p.kill()
    p.communicate(timeout=60)
    assert not dst.exists()
    stale = _leftovers(tmp_path, "dst")
    assert len(stale) == 1  # SIGKILL cannot be caught: the hidden temporary stays...
    r = _run("convert", str(modelopt_exports["llama"]), str(dst), "--to", "modelopt")
    assert r.returncode == 0, r.stderr
    assert dst.is_dir()
    assert not stale[0].exists()  # ...until the next convert to DST
    assert _leftovers(tmp_path, "dst") == []


def test_version_and_every_argument_is_described(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    import nvfp4
    import nvfp4_checkpoints
    from nvfp4_checkpoints.cli import _parser

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"nvfp4-checkpoints) {nvfp4_checkpoints.__version__}" in out
    assert f"nvfp4-core {nvfp4.__version__}" in out
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"inspect", "convert", "verify", "example-checkpoint", "shard"}
    for name, command in sub.choices.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"nvfp4 {name} {action.dest}: no help text"
