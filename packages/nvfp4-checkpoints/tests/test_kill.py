"""Kill safety: ``kill -9`` at 20 random moments of a convert that replaces an existing
destination with ``--force``. After every kill the destination is the complete old or the
complete new checkpoint (``nvfp4 verify``); the next run cleans up what the killed one left
(its marker proves the temporaries are ours), and the last run leaves no temporaries."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from hostile import run_guarded
from nvfp4 import quantize
from nvfp4_checkpoints import write_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"
KILLS = 20


def _checkpoint(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    planes = {
        f"model.layers.{i}.mlp.{p}": quantize(rng.standard_normal((64, 64)).astype(np.float32))
        for i in range(4)
        for p in ("up_proj", "down_proj")
    }
    return write_checkpoint(
        path,
        planes,
        flavour="modelopt",
        config={"model_type": "llama"},
        tensors={"model.norm.weight": np.ones(64, np.float32)},
    )


def test_kill_9_during_a_forced_replace_never_loses_the_destination(tmp_path: Path) -> None:
    old_src = _checkpoint(tmp_path / "old-src", 1)
    new_src = _checkpoint(tmp_path / "new-src", 2)
    out_dir = tmp_path / "out-dir"
    out_dir.mkdir()
    dst = out_dir / "out"
    assert run_guarded(["convert", str(old_src), str(dst), "--to", "mlx"]).status == 0
    env = dict(os.environ, NVFP4_TEST_SLOW_CONVERT="0.08")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    rng = random.Random(0)
    outcomes = {"old": 0, "new": 0}
    for _ in range(KILLS):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nvfp4_checkpoints.cli",
                "convert",
                str(new_src),
                str(dst),
                "--to",
                "mlx",
                "--force",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        is_old = run_guarded(["verify", str(dst), str(old_src)]).status == 0
        is_new = run_guarded(["verify", str(dst), str(new_src)]).status == 0
        assert is_old or is_new, "the destination is neither the old nor the new checkpoint"
        outcomes["old" if is_old else "new"] += 1
    last = run_guarded(["convert", str(new_src), str(dst), "--to", "mlx", "--force"])
    assert last.status == 0, last.stderr
    assert run_guarded(["verify", str(dst), str(new_src)]).status == 0
    assert os.listdir(out_dir) == ["out"], os.listdir(out_dir)
    print(f"kills: {KILLS}, destination old after {outcomes['old']}, new after {outcomes['new']}")
