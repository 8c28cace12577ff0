"""A file swapped after its check is refused, never followed (time of check, time of use).

:meth:`CheckpointFolder.open_member` checks a member (a regular file inside the folder, no
symlink on the way) and then opens that very file: component by component with
``O_NOFOLLOW``, non-blocking, and with its device and inode compared to the checked ones.
Here the swap happens between the check and the open (a hook on the check), as a process
racing the tool would do it: the member becomes a symlink out of the folder, another
regular file, a named pipe, or a folder on its path becomes a symlink. A safetensors shard
swapped after its header was read, and the files a conversion copies or hands to gguf-py
(tokenizer, chat template), are refused the same way, and no byte from outside is read.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hostile import outside_reads, run_guarded
from nvfp4 import quantize
from nvfp4_checkpoints import CheckpointError, open_checkpoint, write_checkpoint
from nvfp4_checkpoints.folder import CheckpointFolder
from nvfp4_checkpoints.safetensors_io import SafetensorsFile
from small_models import TOKENIZER_JSON

SECRET = b'{"secret": "outside the checkpoint"}'
CONFIG = {"model_type": "llama", "num_hidden_layers": 1, "vocab_size": 3}


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``(folder, outside)``: a folder with ``a.json`` and ``sub/b.json``, and a secret
    file outside it."""
    folder, outside = tmp_path / "ck", tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    outside.mkdir()
    (folder / "a.json").write_text('{"a": 1}')
    (folder / "sub" / "b.json").write_text('{"b": 2}')
    (outside / "a.json").write_bytes(SECRET)
    (outside / "b.json").write_bytes(SECRET)
    return folder, outside


def _swap_after_check(
    monkeypatch: pytest.MonkeyPatch, name: str, swap: Callable[[Path], None]
) -> list[int]:
    """Run ``swap(path)`` once, when member ``name`` has been checked by
    :meth:`CheckpointFolder.open_member` and is about to be opened (the race's window)."""
    real = CheckpointFolder._open_nofollow
    fired: list[int] = []

    def open_nofollow(self: CheckpointFolder, member: str, what: str) -> int:
        if member == name and not fired:
            fired.append(1)
            swap(self.root / name)
        return real(self, member, what)

    monkeypatch.setattr(CheckpointFolder, "_open_nofollow", open_nofollow)
    return fired


def _to_symlink(target: Path) -> Callable[[Path], None]:
    def swap(path: Path) -> None:
        tmp = path.with_name(path.name + ".swap")
        tmp.symlink_to(target)
        os.replace(tmp, path)

    return swap


def test_a_member_opens_as_the_file_checked(layout: tuple[Path, Path]) -> None:
    folder, _ = layout
    with CheckpointFolder(folder).open_member("sub/b.json") as f:
        assert f.read() == b'{"b": 2}'
    assert CheckpointFolder(folder).json("a.json") == {"a": 1}


def test_swapped_for_a_symlink_outside_is_refused(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, outside = layout
    fired = _swap_after_check(monkeypatch, "a.json", _to_symlink(outside / "a.json"))
    with pytest.raises(
        CheckpointError,
        match=r"file 'a.json': expected the regular file "
        r"checked a moment before, found a symlink \(replaced during the read\)",
    ):
        CheckpointFolder(folder).json("a.json")
    assert fired == [1]
    assert os.path.islink(folder / "a.json")  # the swap happened, and was not followed


def _sub_folder_to_symlink(path: Path, folder: Path, outside: Path) -> None:
    shutil.rmtree(folder / "sub")
    (folder / "sub").symlink_to(outside)


def _to_another_file(path: Path, folder: Path, outside: Path) -> None:
    tmp = path.with_name("new")
    tmp.write_bytes(SECRET)
    os.replace(tmp, path)


def _to_named_pipe(path: Path, folder: Path, outside: Path) -> None:
    path.unlink()
    os.mkfifo(path)  # a blocking open would wait for a writer forever


@pytest.mark.parametrize(
    ("member", "swap", "match"),
    [
        pytest.param(
            "sub/b.json",
            _sub_folder_to_symlink,
            r"'sub/b.json': expected the regular file .*found a symlink",
            id="a-folder-on-the-path-for-a-symlink",
        ),
        pytest.param(
            "a.json",
            _to_another_file,
            r"found another file \(replaced during the read\)",
            id="for-another-file",
        ),
        pytest.param(
            "a.json",
            _to_named_pipe,
            r"found a named pipe \(replaced during the read\)",
            id="for-a-named-pipe-without-waiting",
        ),
    ],
)
def test_swapped_after_its_check_is_refused(
    layout: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    member: str,
    swap: Callable[[Path, Path, Path], None],
    match: str,
) -> None:
    folder, outside = layout
    fired = _swap_after_check(monkeypatch, member, lambda path: swap(path, folder, outside))
    with pytest.raises(CheckpointError, match=match):
        CheckpointFolder(folder).json(member)
    assert fired == [1]


def _modelopt(path: Path) -> Path:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    planes = {"model.layers.0.mlp.down_proj": quantize(w)}
    tensors = {"model.norm.weight": np.ones(64, np.float32)}
    return write_checkpoint(path, planes, flavour="modelopt", tensors=tensors, config=CONFIG)


def test_a_shard_swapped_after_its_header_is_refused(tmp_path: Path) -> None:
    ck = _modelopt(tmp_path / "ck")
    other = _modelopt(tmp_path / "other")  # a valid shard with the same header
    shard = ck / "model.safetensors"
    with open_checkpoint(ck) as c:
        # moved aside, not deleted: its inode stays allocated, so the copy below cannot be
        # given the same inode number (the identity checked is (st_dev, st_ino); a file
        # written after the original was deleted can reuse its number, as a CI run saw)
        shard.rename(tmp_path / "original.safetensors")
        shard.symlink_to(other / "model.safetensors")
        with pytest.raises(CheckpointError, match=r"'model.safetensors': is a symlink"):
            c.tensor("model.norm.weight")
        shard.unlink()
        shutil.copyfile(other / "model.safetensors", shard)  # another inode
        with pytest.raises(CheckpointError, match=r"replaced since its header was read"):
            c.tensor("model.norm.weight")


def test_a_plain_safetensors_file_still_maps(tmp_path: Path) -> None:
    ck = _modelopt(tmp_path / "ck")
    sf = SafetensorsFile(ck / "model.safetensors")
    assert np.array_equal(sf.get("model.norm.weight"), np.ones(64, np.float32))


@pytest.mark.parametrize("to", ["modelopt", "compressed-tensors", "mlx", "gguf"])
@pytest.mark.parametrize("swapped", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_conversion_never_reads_a_file_swapped_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str, swapped: str
) -> None:
    """The files a conversion copies (folder outputs) or hands to gguf-py (GGUF output)
    are read through the checked file: swapped for a symlink out of the checkpoint after
    the check, the conversion exits 2 naming it, and the secret is read by nobody."""
    if to == "gguf":
        pytest.importorskip("gguf")
    (tmp_path / "src").mkdir()
    ck = _modelopt(tmp_path / "src" / "ck")
    (ck / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (ck / "tokenizer_config.json").write_text(json.dumps({"eos_token": "ab"}))
    (ck / "chat_template.jinja").write_text("{{ 'the template' }}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / swapped).write_bytes(SECRET)
    (tmp_path / "dst").mkdir()
    dst = tmp_path / "dst" / ("o.gguf" if to == "gguf" else "o")
    fired = _swap_after_check(monkeypatch, swapped, _to_symlink(outside / swapped))
    outcome = run_guarded(["convert", str(ck), str(dst), "--to", to], trace_memory=False)
    assert fired == [1]
    assert outcome.error is None, outcome.error
    assert outcome.status == 2, outcome.stderr
    assert f"file '{swapped}': expected the regular file checked" in outcome.stderr
    assert os.listdir(tmp_path / "dst") == []
    assert outside_reads(outcome.opened, [ck, tmp_path / "dst"], [tmp_path]) == []
