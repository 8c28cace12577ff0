"""A seeded mutation fuzz of the CLI over small valid checkpoints of every flavour.

For each flavour (ModelOpt, compressed-tensors, MLX, GGUF) a small valid checkpoint is
made; each example copies it and applies one to three random mutations, drawn from a
``random.Random`` seeded by ``(NVFP4_FUZZ_SEED, flavour, example)``, so a failure names
the seed and example that reproduce it:

* ``json``: a value of ``config.json``, ``hf_quant_config.json`` or the shard index,
  anywhere in its tree, replaced by a hostile value, deleted, or given a sibling; or the
  file's text cut short, made ``NaN`` or nested deeply;
* ``header``: the same in a safetensors header (dtypes, shapes, data offsets, metadata),
  the file rewritten around the new header;
* ``gguf``: one part of a GGUF key-value or tensor-info record (a length, a type, a count,
  a string, a value, a dimension, an offset) overwritten with a hostile value of its width;
* ``bytes``: bits flipped (mostly in the first kilobytes), a file cut short or grown, a
  64-bit hostile integer written at a random place.

Then ``inspect``, ``convert`` to each of the four flavours and ``verify`` against the
original run in-process under the audit hook of :mod:`hostile`, and every outcome must
keep the README's promises: an exit status of 0, 2 (or 1 for ``verify``), never an
escaped exception nor the top-level guard's "internal error"; a refusal is one line and
leaves nothing next to the destination; no file outside the checkpoint (and the
destination's folder; the original for ``verify``) is opened; the source is not changed;
and when ``convert`` exits 0 its output verifies equal to the mutated source.

CI runs :data:`EXAMPLES` mutated checkpoints (``NVFP4_FUZZ_EXAMPLES``, default 1,000, a
quarter per flavour: about 40 s on a 2-core VM). The nightly run sets
``NVFP4_FUZZ_EXAMPLES=10000`` (and a fresh ``NVFP4_FUZZ_SEED``); see the README's
"Safety" section.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import MAX_SECONDS, Outcome, outside_reads, run_guarded, tree_hash
from nvfp4 import quantize
from nvfp4.fusion import stack_experts
from nvfp4_checkpoints import FLAVOURS, open_checkpoint, write_checkpoint
from small_models import llama_config

EXAMPLES = int(os.environ.get("NVFP4_FUZZ_EXAMPLES", "1000"))
SEED = int(os.environ.get("NVFP4_FUZZ_SEED", "0"))
CONFIG = llama_config(kv_heads=4)
Q = "model.layers.0.self_attn.q_proj"
K = "model.layers.0.self_attn.k_proj"
UP = "model.layers.0.mlp.experts.{}.up_proj"

#: Values a mutation puts in a JSON tree.
HOSTILE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    3,
    4,
    8,
    16,
    32,
    64,
    128,
    2**31,
    2**63,
    -(2**63),
    10**39,
    1.5,
    -0.0,
    1e308,
    "",
    "x",
    "F32",
    "F16",
    "F64",
    "U8",
    "I8",
    "U16",
    "I16",
    "I32",
    "U32",
    "BOOL",
    "BF16",
    "F8_E4M3",
    "float16",
    "bfloat16",
    "int8",
    "tensor_group",
    "group",
    "channel",
    "nvfp4",
    "NVFP4",
    "MIXED_PRECISION",
    "modelopt",
    "compressed-tensors",
    "model.safetensors",
    "../outside/secret.txt",
    "/etc/passwd",
    "a" * 300,
    [],
    [0],
    [-1],
    [64, 64],
    [32, 64],
    [64, 32],
    [64, 4],
    [64, 8],
    [2, 64, 32],
    [1],
    [0, 0],
    [2**40, 2**40],
    [0, 2**62],
    {},
    {"a": 1},
    [[[[]]]],
]
#: Integers a mutation writes in binary (as 8, 4, 2 or 1 bytes, little-endian).
HOSTILE_INTS = [
    *(0, 1, 2, 7, 16, 24, 25, 26, 30, 32, 40, 64, 0x7F, 0x80, 0xFF, 2**15),
    *(2**31 - 1, 2**31, 2**32 - 1, 2**62, 2**64 - 1),
]


# ==================================================================== checkpoints
def _planes() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {
        p: quantize(rng.standard_normal((64, 64)).astype(np.float32), name=p) for p in (Q, K)
    }
    experts = [quantize(rng.standard_normal((64, 64)).astype(np.float32)) for _ in range(2)]
    out[UP] = stack_experts(experts, name=UP)
    return out


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_originals(tmp_path_factory.mktemp("originals"))


def make_originals(base: Path) -> dict[str, Path]:
    """One small valid checkpoint of each flavour under ``base``; the Hugging Face ones in
    shards (an index to mutate) with a tokenizer config beside them."""
    for flavour in FLAVOURS:
        (base / flavour).mkdir(parents=True)
    first = write_checkpoint(
        base / "modelopt" / "ck",
        _planes(),
        flavour="modelopt",
        tensors={
            "model.norm.weight": np.ones(64, np.float32),
            "model.embed_tokens.weight": np.ones((64, 64), np.float32),
        },
        config=CONFIG,
        input_scales={Q: 0.5, K: 0.25},
        max_shard_bytes=8192,
    )
    (first / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    out = {"modelopt": first}
    with open_checkpoint(first) as ck:
        for flavour in FLAVOURS[1:]:
            name = "ck.gguf" if flavour == "gguf" else "ck"
            out[flavour] = write_checkpoint(
                base / flavour / name, ck, flavour=flavour, max_shard_bytes=8192
            )
    return out


# ====================================================================== mutations
def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value in a JSON tree (the root excluded)."""
    items: Any = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


def _mutate_tree(rng: random.Random, tree: Any) -> str:
    """One edit of a JSON tree in place; what it did."""
    paths = list(_paths(tree))
    if not paths:
        return "nothing to edit"
    path = rng.choice(paths)
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    roll = rng.random()
    if roll < 0.6:
        value = rng.choice(HOSTILE_VALUES)
        parent[key] = value
        return f"{list(path)} = {value!r:.40}"
    if roll < 0.8:
        del parent[key]
        return f"del {list(path)}"
    if isinstance(parent, dict):
        new = rng.choice(["", "__metadata__", "x", str(key) + ".", "weight", "shape"])
        parent[new] = rng.choice(HOSTILE_VALUES)
        return f"{[*path[:-1], new]} added"
    parent.append(rng.choice(HOSTILE_VALUES))
    return f"{list(path[:-1])} appended"


def _json_files(ck: Path) -> list[Path]:
    return sorted(p for p in ck.glob("*.json"))


def _mutate_json(rng: random.Random, ck: Path) -> str:
    path = rng.choice(_json_files(ck))
    text = path.read_text(errors="replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # an earlier mutation broke it: mutate its bytes
        return _mutate_bytes(rng, ck)
    roll = rng.random()
    if roll < 0.8:
        what = _mutate_tree(rng, data)
        path.write_text(json.dumps(data))
    elif roll < 0.87:
        cut = rng.randrange(len(text))
        path.write_text(text[:cut])
        what = f"cut at {cut}"
    elif roll < 0.94:
        path.write_text(text.replace("0.5", "NaN", 1).replace("64", "Infinity", 1))
        what = "NaN / Infinity"
    else:
        depth = rng.choice([63, 64, 65, 1000])
        path.write_text(text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}")
        what = f"nested {depth} deep"
    return f"json {path.name}: {what}"


def _mutate_header(rng: random.Random, ck: Path) -> str:
    path = rng.choice(sorted(ck.glob("*.safetensors")))
    raw = path.read_bytes()
    try:
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        assert isinstance(header, dict)
    except (struct.error, ValueError, RecursionError, AssertionError):  # broken before
        return _mutate_bytes(rng, ck)
    what = _mutate_tree(rng, header)
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    return f"header {path.name}: {what}"


def _gguf_parts(path: Path) -> list[tuple[int, int, str]]:
    """``(offset, width, what)`` of every part of every key-value and tensor-info record
    (gguf-py's reader; the tensor data left out)."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]
    fields = [*reader.fields.values(), *(t.field for t in reader.tensors)]
    out = []
    for field in fields:
        for i, part in enumerate(field.parts):
            offset = part.__array_interface__["data"][0] - base
            out.append((offset, int(part.nbytes), f"{field.name} part {i}"))
    del reader
    return out


_GGUF_PARTS: dict[Path, list[tuple[int, int, str]]] = {}


def _mutate_gguf(rng: random.Random, ck: Path, original: Path) -> str:
    if original not in _GGUF_PARTS:
        _GGUF_PARTS[original] = _gguf_parts(original)
    offset, width, what = rng.choice(_GGUF_PARTS[original])
    raw = bytearray(ck.read_bytes())
    if width in (1, 2, 4, 8) and rng.random() < 0.8:
        value = rng.choice(
            [
                *HOSTILE_INTS,
                rng.randrange(256),
                int.from_bytes(raw[offset : offset + width], "little") + rng.choice([-1, 1]),
            ]
        )
        raw[offset : offset + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
        said = f"= {value}"
    else:
        raw[offset : offset + width] = bytes(
            rng.choice([0, 0x2E, 0x2F, 0xFF]) for _ in range(width)
        )
        said = "overwritten"
    ck.write_bytes(bytes(raw))
    return f"gguf {what} (at {offset}, {width} bytes) {said}"


def _mutate_bytes(rng: random.Random, ck: Path) -> str:
    files = [ck] if ck.is_file() else sorted(p for p in ck.iterdir() if p.is_file())
    path = rng.choice(files)
    raw = bytearray(path.read_bytes())
    if not raw:
        return f"bytes {path.name}: empty"
    roll = rng.random()
    if roll < 0.5:
        span = min(len(raw), 4096 if rng.random() < 0.8 else len(raw))
        at = sorted(rng.randrange(span) for _ in range(rng.randint(1, 4)))
        for i in at:
            raw[i] ^= 1 << rng.randrange(8)
        what = f"bits flipped at {at}"
    elif roll < 0.65:
        cut = rng.randrange(len(raw))
        del raw[cut:]
        what = f"cut at {cut}"
    elif roll < 0.75:
        extra = rng.choice([1, 7, 64, 4096])
        raw += bytes(rng.randrange(256) for _ in range(extra))
        what = f"{extra} bytes appended"
    else:
        i = rng.randrange(max(1, len(raw) - 8))
        value = rng.choice(HOSTILE_INTS)
        raw[i : i + 8] = value.to_bytes(8, "little")[: len(raw) - i]
        what = f"u64 {value} at {i}"
    path.write_bytes(bytes(raw))
    return f"bytes {path.name}: {what}"


def mutate(rng: random.Random, ck: Path, original: Path) -> list[str]:
    """One to three mutations of the checkpoint at ``ck`` (a copy of ``original``)."""
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        roll = rng.random()
        if ck.is_file():
            done.append(_mutate_gguf(rng, ck, original) if roll < 0.7 else _mutate_bytes(rng, ck))
        elif roll < 0.35:
            done.append(_mutate_header(rng, ck))
        elif roll < 0.7 and _json_files(ck):
            done.append(_mutate_json(rng, ck))
        else:
            done.append(_mutate_bytes(rng, ck))
    return done


# ======================================================================== the runs
def _check(
    outcome: Outcome, *, allowed: list[Path], work: Path, statuses: set[int], what: str
) -> None:
    """The promises every run keeps, whatever it was given."""
    assert outcome.error is None, f"{what}: an escaped exception\n{outcome.error}"
    assert outcome.status in statuses, f"{what}: exit {outcome.status}: {outcome.stderr!r}"
    assert "internal error" not in outcome.stderr, f"{what}: {outcome.stderr!r}"
    assert "Traceback" not in outcome.stderr, f"{what}: {outcome.stderr!r}"
    if outcome.status == 2:
        lines = [ln for ln in outcome.stderr.splitlines() if ln.startswith("nvfp4: error: ")]
        assert len(lines) == 1, f"{what}: {outcome.stderr!r}"
        assert len(lines[0]) <= 300 + len("nvfp4: error: "), f"{what}: {lines[0]!r}"
    bad = outside_reads(outcome.opened, allowed, [work])
    assert not bad, f"{what}: read outside the checkpoint: {bad}"
    assert outcome.seconds < MAX_SECONDS, f"{what}: {outcome.seconds:.1f} s"


def _empty(folder: Path) -> None:
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


FIGURES: Counter[str] = Counter()


def fuzz_one(flavour: str, original: Path, work: Path, example: int) -> None:
    """Mutate a copy of ``original``, run every command on it, check every promise."""
    rng = random.Random(f"{SEED}/{flavour}/{example}")
    for sub in ("src", "dst"):
        if (work / sub).exists():
            shutil.rmtree(work / sub)
        (work / sub).mkdir(parents=True)
    (work / "outside").mkdir(exist_ok=True)
    (work / "outside" / "secret.txt").write_text("secret\n")
    src = work / "src" / original.name
    if original.is_file():
        shutil.copyfile(original, src)
    else:
        shutil.copytree(original, src)
    done = mutate(rng, src, original)
    where = f"NVFP4_FUZZ_SEED={SEED} {flavour} example {example}: {'; '.join(done)}"
    before = tree_hash(src)
    dst_dir = work / "dst"
    home = [src if src.is_dir() else src.parent]
    runs: list[tuple[list[str], list[Path], set[int]]] = [(["inspect", str(src)], home, {0, 2})]
    for to in FLAVOURS:
        dst = dst_dir / ("out.gguf" if to == "gguf" else "out")
        runs.append((["convert", str(src), str(dst), "--to", to], [*home, dst_dir], {0, 2}))
    runs.append((["verify", str(src), str(original)], [*home, original.parent], {0, 1, 2}))
    for argv, allowed, statuses in runs:
        what = f"{where}: nvfp4 {argv[0]} {' '.join(argv[3:])}".rstrip()
        outcome = run_guarded(argv, trace_memory=False)
        _check(outcome, allowed=allowed, work=work, statuses=statuses, what=what)
        assert tree_hash(src) == before, f"{what}: the source changed"
        FIGURES[f"{argv[0]} {outcome.status}"] += 1
        if argv[0] != "convert":
            continue
        out = Path(argv[2])
        if outcome.status != 0:
            assert os.listdir(dst_dir) == [], f"{what}: left {os.listdir(dst_dir)}"
            continue
        check = run_guarded(["verify", str(src), str(out)], trace_memory=False)
        _check(check, allowed=[*home, dst_dir], work=work, statuses={0}, what=f"{what}: verify")
        _empty(dst_dir)
    FIGURES["examples"] += 1


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    """The counts of examples and of exit statuses per command, after the module."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and FIGURES:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(FIGURES.items()))
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nfuzz (NVFP4_FUZZ_SEED={SEED}): {counts}")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_mutated_checkpoints_keep_every_promise(
    originals: dict[str, Path], tmp_path: Path, flavour: str
) -> None:
    if flavour == "gguf":
        pytest.importorskip("gguf")
    share = -(-EXAMPLES // len(FLAVOURS))
    for example in range(share):
        fuzz_one(flavour, originals[flavour], tmp_path, example)


def test_the_originals_are_valid(originals: dict[str, Path]) -> None:
    """The fuzz starts from checkpoints every command accepts (so a refusal is the
    mutation's doing)."""
    for flavour, path in originals.items():
        outcome = run_guarded(["inspect", str(path)], trace_memory=False)
        assert outcome.status == 0, (flavour, outcome.stderr)
