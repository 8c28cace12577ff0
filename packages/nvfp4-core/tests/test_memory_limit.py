"""The memory bound of plane checks: min(physical memory, the cgroup's memory limit).

:func:`nvfp4.planes.cgroup_memory_limit` reads a container's limit (cgroup v2
``memory.max``, v1 ``memory.limit_in_bytes``) from a fake cgroup tree here, with hostile
contents, and :func:`nvfp4.planes.memory_bytes` takes the smaller of it and the RAM, so
the "would need more than the machine's memory" refusal fires at the container's limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvfp4 import planes as planes_mod
from nvfp4.planes import PlaneError, cgroup_memory_limit, check_decoded_size, memory_bytes

GIB = 2**30


def _tree(tmp_path: Path, files: dict[str, bytes], proc: str = "0::/\n") -> tuple[str, str]:
    root = tmp_path / "cgroup"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    root.mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc_cgroup").write_text(proc)
    return str(root), str(tmp_path / "proc_cgroup")


@pytest.fixture
def fresh_memory_bytes() -> Iterator[None]:
    memory_bytes.cache_clear()
    yield
    memory_bytes.cache_clear()


def test_v2_memory_max_is_the_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(*_tree(tmp_path, {"memory.max": b"2147483648\n"})) == 2 * GIB


def test_v2_own_cgroup_wins_when_lower(tmp_path: Path) -> None:
    files = {"memory.max": b"max\n", "box/job/memory.max": b"1073741824\n"}
    assert cgroup_memory_limit(*_tree(tmp_path, files, "0::/box/job\n")) == GIB
    files = {"memory.max": b"536870912\n", "box/job/memory.max": b"1073741824\n"}
    assert cgroup_memory_limit(*_tree(tmp_path / "b", files, "0::/box/job\n")) == GIB // 2


def test_v1_limit_in_bytes(tmp_path: Path) -> None:
    files = {"memory/memory.limit_in_bytes": b"9223372036854771712\n"}  # v1's "no limit"
    assert cgroup_memory_limit(*_tree(tmp_path, files)) is None
    files["memory/docker/abc/memory.limit_in_bytes"] = b"3221225472\n"
    proc = "4:memory:/docker/abc\n0::/\n"
    assert cgroup_memory_limit(*_tree(tmp_path / "b", files, proc)) == 3 * GIB


def test_no_cgroup_files_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(*_tree(tmp_path, {})) is None
    assert cgroup_memory_limit(str(tmp_path / "absent"), str(tmp_path / "absent2")) is None


@pytest.mark.parametrize(
    "contents",
    [
        b"max\n",
        b"",
        b"\n",
        b"-1\n",
        b"0\n",
        b"1.5\n",
        b"1e9\n",
        b"12 34\n",
        b"0x1000\n",
        b"abc",
        b"\xff\xfe\x00",
        "\u0661\u0662\u0663".encode(),  # Arabic-Indic digits: not ASCII digits
        b"1" * 100,  # longer than any limit file
        b"9" * 30 + b"\n",  # beyond the address space
    ],
)
def test_hostile_contents_are_no_limit(tmp_path: Path, contents: bytes) -> None:
    assert cgroup_memory_limit(*_tree(tmp_path, {"memory.max": contents})) is None


def test_a_directory_or_fifo_in_place_of_the_file(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, {})
    os.mkdir(os.path.join(root, "memory.max"))
    assert cgroup_memory_limit(root, proc) is None
    root2, proc2 = _tree(tmp_path / "b", {})
    os.mkfifo(os.path.join(root2, "memory.max"))  # a blocking open would hang here
    assert cgroup_memory_limit(root2, proc2) is None


def test_a_climbing_cgroup_path_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_bytes(b"4096\n")  # outside the cgroup root
    root, proc = _tree(tmp_path / "t", {}, "0::/../..\n")
    assert cgroup_memory_limit(root, proc) is None


def test_memory_bytes_is_the_smaller_of_ram_and_cgroup(
    monkeypatch: pytest.MonkeyPatch, fresh_memory_bytes: None
) -> None:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(planes_mod, "cgroup_memory_limit", lambda: None)
    assert memory_bytes() == min(ram, 2**47)
    memory_bytes.cache_clear()
    monkeypatch.setattr(planes_mod, "cgroup_memory_limit", lambda: 64 * 2**20)
    assert memory_bytes() == 64 * 2**20
    memory_bytes.cache_clear()
    monkeypatch.setattr(planes_mod, "cgroup_memory_limit", lambda: 4 * ram)
    assert memory_bytes() == min(ram, 2**47)


def test_the_refusal_fires_at_the_cgroup_limit(
    monkeypatch: pytest.MonkeyPatch, fresh_memory_bytes: None
) -> None:
    monkeypatch.setattr(planes_mod, "cgroup_memory_limit", lambda: 64 * 2**20)
    check_decoded_size("w", (4096, 4096))  # 64 MiB of float32: fits exactly
    with pytest.raises(PlaneError, match=r"at most 67108864 bytes\), found \(4097, 4096\)"):
        check_decoded_size("w", (4097, 4096))


def test_this_machine_reads_without_error() -> None:
    limit = cgroup_memory_limit()
    assert limit is None or 0 < limit < 2**47
    assert 0 < memory_bytes() <= 2**47
