"""``python -m nvfp4_torch generate`` (also the ``nvfp4-generate`` command): greedy text generation from an NVFP4 checkpoint
with every NVFP4 linear on a backend, for people (``--prompt``) and for scripts
(``--prompt-ids``, JSON out).

* The checkpoint is any flavour nvfp4-checkpoints reads: a ModelOpt, compressed-tensors or
  MLX folder, or a GGUF file; its tokenizer comes from the folder's tokenizer files or the
  GGUF's tokenizer metadata (:func:`nvfp4_checkpoints.tokenizer.load_hf_tokenizer`).
* ``--prompt TEXT`` goes through the tokenizer's chat template when it has one (``--raw``:
  the text as is); the reply is printed as it is generated, decoding stops at the model's
  end-of-sequence token, and a summary line on stderr gives the backend, the prompt and
  decode times and tokens per second.
* ``--prompt-ids 1,2,3`` decodes exactly ``--max-new-tokens`` tokens and prints
  ``{"new_ids": [...]}`` on stdout (with ``--forward transformers --no-fuse``: the code path
  tier T6 certifies).
* ``--profile`` adds the share of decode time spent inside the backend's verbs.
* torch's own operations run on one thread (``--torch-threads``): at batch 1 they are tiny,
  and torch's idle threads, spinning, take the cores from the backend's kernels (on a busy
  2-core machine a step took 5 times as long with torch on 2 threads).
* Decoding fuses q/k/v and gate/up into one product each
  (:func:`nvfp4_torch.modules.bind_linears`: the same numbers, fewer calls);
  ``--no-fuse`` calls the backend once per checkpoint tensor, as T6 does.
* Llama-family models decode on :class:`nvfp4_torch.lean_decoder.LeanDecoder` (the
  transformers model's weights and NVFP4 linears, a few torch operations a layer, the same
  logits bit for bit in the tests); ``--forward transformers`` runs the transformers forward
  as T6 does; other architectures always do.

What generate needs (torch, transformers: the ``parity`` extra) is checked before anything is
loaded, and a missing piece is named with the command that installs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from nvfp4.contract import KERNELS

from .decode import DECODE_TORCH_THREADS

__all__ = ["TimedBackend", "add_arguments", "main", "missing_requirements", "run"]

#: What generate imports, and the distribution each comes from.
REQUIREMENTS = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("nvfp4_checkpoints", "nvfp4-checkpoints"),
)
INSTALL_HINT = "pip install 'nvfp4-torch[models]'"
#: ``--forward`` choices.
FORWARDS = ("lean", "transformers")


def missing_requirements() -> list[str]:
    """The distributions generate needs that are not installed (found without importing)."""
    return [dist for module, dist in REQUIREMENTS if importlib.util.find_spec(module) is None]


def add_arguments(gen: argparse.ArgumentParser) -> None:
    """The ``generate`` sub-command's arguments."""
    gen.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="an NVFP4 checkpoint: a ModelOpt, compressed-tensors or MLX folder, or a .gguf file",
    )
    gen.add_argument("--backend", default=None, help="backend name (default: the best available)")
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="text to answer (through the chat template, if any)")
    what.add_argument(
        "--prompt-ids",
        help='comma-separated prompt token ids; prints {"new_ids": [...]} (exactly '
        "--max-new-tokens of them) as JSON",
    )
    gen.add_argument("--max-new-tokens", type=int, default=40)
    gen.add_argument(
        "--raw", action="store_true", help="--prompt: tokenize the text as is, no chat template"
    )
    gen.add_argument(
        "--ignore-eos", action="store_true", help="--prompt: do not stop at end-of-sequence"
    )
    gen.add_argument(
        "--no-fuse",
        action="store_true",
        help="one backend call per checkpoint tensor (as T6), not q/k/v and gate/up fused",
    )
    gen.add_argument(
        "--forward",
        choices=FORWARDS,
        default="lean",
        help="lean: a batch-1 decoder for Llama-family models (others fall back to "
        "transformers); transformers: the transformers forward, as T6 runs",
    )
    gen.add_argument(
        "--profile",
        action="store_true",
        help="report where decode time goes: backend verbs, the float lm_head (lean), the rest",
    )
    gen.add_argument(
        "--torch-threads",
        type=int,
        default=DECODE_TORCH_THREADS,
        help="threads for torch's own operations (attention, norms, the float lm_head); "
        "default 1: at batch 1 they are too small to split, and torch's idle threads spin "
        "against the backend's (the backend's kernels keep their own threads)",
    )


class TimedBackend:
    """A backend whose verbs (:data:`nvfp4.contract.KERNELS`: ``qmm``, ``gather_qmm``,
    ``dequantize``, the W4A4 / W4A8 ones) add their wall time to :attr:`seconds` and count their calls; every other attribute is
    the wrapped backend's."""

    VERBS = frozenset(KERNELS)

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name not in self.VERBS:
            return attr
        return self._timed(attr)

    def _timed(self, verb: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return verb(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return call


def _parse_ids(text: str) -> list[int] | str:
    """The ids of ``--prompt-ids``, or the error message."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        return f"--prompt-ids: expected comma-separated integers, found {text!r}"
    if not ids:
        return "--prompt-ids: at least one token id is needed"
    return ids


def _stop_ids(tokenizer: Any, config: dict[str, Any]) -> set[int]:
    """End-of-sequence ids: the config's ``eos_token_id`` (an id or a list) and the
    tokenizer's."""
    found: set[int] = set()
    eos = config.get("eos_token_id")
    for value in eos if isinstance(eos, list) else [eos]:
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        found.add(tok_eos)
    return found


def _encode(tokenizer: Any, text: str, raw: bool) -> tuple[list[int], bool]:
    """The prompt's ids and whether the chat template made them."""
    if not raw and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids], True
    return [int(i) for i in tokenizer.encode(text)], False


class _Streamer:
    """Prints the decoded reply as tokens arrive: each time, the text decoded so far minus
    what was printed (a token may complete a character only with the next one)."""

    def __init__(self, tokenizer: Any, out: TextIO) -> None:
        self.tokenizer = tokenizer
        self.out = out
        self.ids: list[int] = []
        self.printed = ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
            return
        if text.startswith(self.printed):
            self.out.write(text[len(self.printed) :])
        else:  # decoding is not prefix-stable here: print the rest on a new line
            self.out.write("\n" + text)
        self.printed = text
        self.out.flush()


def _backend_line(backend: Any) -> str:
    """The backend's name, version and device (its availability's ``device``)."""
    info = backend.info
    device = getattr(backend.availability(), "device", "") or ""
    version = f" {info.version}" if info.version else ""
    return f"{info.name}{version}" + (f" ({device})" if device else "")


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f} tokens/s" if seconds > 0 else "- tokens/s"


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The ``generate`` command, printing to ``out`` / ``err`` (default: ``sys.stdout`` /
    ``sys.stderr`` at the time of the call); returns the exit status (2: bad arguments or a
    missing requirement, 1: the checkpoint could not be used)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if args.max_new_tokens < 1:
        print(f"--max-new-tokens: expected >= 1, found {args.max_new_tokens}", file=err)
        return 2
    if args.torch_threads < 1:
        print(f"--torch-threads: expected >= 1, found {args.torch_threads}", file=err)
        return 2
    ids: list[int] | None = None
    if args.prompt_ids is not None:
        parsed = _parse_ids(args.prompt_ids)
        if isinstance(parsed, str):
            print(parsed, file=err)
            return 2
        ids = parsed
    missing = missing_requirements()
    if missing:
        print(f"generate needs {', '.join(missing)} (not installed): {INSTALL_HINT}", file=err)
        return 2
    from .launch import torchrun_world

    try:
        world = torchrun_world()
    except ValueError as exc:
        print(f"generate: {exc}", file=err)
        return 2
    if world > 1 and args.forward == "transformers":
        print(
            f"--forward transformers: a tensor-parallel run (WORLD_SIZE={world}) decodes on "
            "the lean forward only (the sharded one); leave --forward out",
            file=err,
        )
        return 2
    if world == 1:
        return _generate(args, ids, out, err, parallel=False)
    return _ranked(args, ids, out, err)


def _ranked(args: argparse.Namespace, ids: list[int] | None, out: TextIO, err: TextIO) -> int:
    """:func:`_generate` on one rank of a torchrun launch: join the process group, print on
    rank 0 only (another rank's messages are printed, with its rank, when it fails)."""
    import datetime
    import io

    import nvfp4
    import torch.distributed as dist
    from nvfp4.registry import BackendUnavailable

    from .launch import init_from_env

    try:
        launch = init_from_env(nvfp4.get_backend(args.backend))
    except (BackendUnavailable, ValueError) as exc:
        print(f"generate: {exc}", file=err)
        return 2
    quiet = launch.rank != 0
    held = io.StringIO()  # another rank's messages, shown only when it fails
    try:
        if quiet:
            status = _generate(args, ids, io.StringIO(), held, parallel=True)
        else:
            status = _generate(args, ids, out, err, parallel=True)
        # every rank done before any tears its group down: a rank that destroyed its gloo
        # group while a peer was still finishing made that peer abort ("terminate called
        # without an active exception", seen once in CI); a dead peer ends the wait in 2 min
        if launch.process_group == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(minutes=2))
        else:
            dist.barrier()
    finally:
        dist.destroy_process_group()
    if quiet and status != 0:
        for line in held.getvalue().splitlines():
            print(f"rank {launch.rank}: {line}", file=err)
    return status


def _generate(
    args: argparse.Namespace,
    ids: list[int] | None,
    out: TextIO,
    err: TextIO,
    *,
    parallel: bool,
) -> int:
    """:func:`run` once the arguments are checked: on one process, or (``parallel``) on
    this rank of an initialised process group with a
    :class:`~nvfp4_torch.parallel_decoder.ParallelDecoder`."""
    import nvfp4
    import torch
    from nvfp4.registry import BackendUnavailable
    from nvfp4_checkpoints import CheckpointError
    from nvfp4_checkpoints.tokenizer import TokenizerUnavailable, load_hf_tokenizer

    from . import decode, loader

    try:
        backend = nvfp4.get_backend(args.backend)
    except BackendUnavailable as exc:
        print(str(exc), file=err)
        return 2
    tokenizer = None
    if ids is None:  # --prompt: the tokenizer first, before the model takes its time
        try:
            tokenizer = load_hf_tokenizer(args.checkpoint)
        except TokenizerUnavailable as exc:
            print(f"generate --prompt needs the checkpoint's tokenizer: {exc}", file=err)
            return 1
    torch.set_num_threads(args.torch_threads)  # loading and the prompt's pass too
    timed = TimedBackend(backend)
    start = time.perf_counter()
    try:
        loaded = loader.load_model(args.checkpoint, timed, fuse=not args.no_fuse, bind=not parallel)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"generate: {exc}", file=err)
        return 1
    load_seconds = time.perf_counter() - start
    vocab = int(getattr(loaded.model.config, "vocab_size", 0) or 0)
    chat = False
    if ids is None:
        ids, chat = _encode(tokenizer, args.prompt, args.raw)
    bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
    if bad:
        print(f"--prompt-ids: ids {bad[:5]} are outside the vocabulary [0, {vocab})", file=err)
        return 2

    lean: Any = None
    forward = "transformers"
    products = loaded.products  # per forward pass (per rank when tensor-parallel)
    if parallel:
        import torch.distributed as dist

        from .parallel_decoder import ParallelDecoder, unsupported_parallel

        why = unsupported_parallel(loaded.model)
        if why is not None:
            print(f"generate: no tensor-parallel decoder for this model: {why}", file=err)
            return 1
        try:
            lean = ParallelDecoder(
                loaded.model, len(ids) + args.max_new_tokens, timed, fuse=not args.no_fuse
            )
        except ValueError as exc:  # a plan that cannot split the model over the ranks
            print(f"generate: {exc}", file=err)
            return 1
        products = lean.products
        forward = f"lean (tensor parallel: {lean.world} ranks, {dist.get_backend()})"
    elif args.forward == "lean":
        from .lean_decoder import LeanDecoder, unsupported

        why = unsupported(loaded.model)
        if why is None:
            lean = LeanDecoder(loaded.model, len(ids) + args.max_new_tokens)
            forward = "lean"
        else:
            print(f"generate: the transformers forward ({why})", file=err)

    stream = None if tokenizer is None else _Streamer(tokenizer, out)
    stop = set() if tokenizer is None or args.ignore_eos else _stop_ids(tokenizer, loaded.config)
    timed.seconds, timed.calls = 0.0, 0
    # verb time and calls, lm_head time, at the end of the prompt's pass
    at_first_token: list[tuple[float, int, float]] = []

    def on_token(token: int) -> None:
        if not at_first_token:
            head_s = 0.0 if lean is None else lean.head_seconds
            at_first_token.append((timed.seconds, timed.calls, head_s))
        if stream is not None:
            stream(token)

    result = decode.greedy(
        loaded.model,
        ids,
        args.max_new_tokens,
        stop_ids=stop,
        on_token=on_token,
        torch_threads=args.torch_threads,
        lean=lean,
    )
    if stream is None:
        print(json.dumps({"new_ids": result.new_ids}), file=out)
    else:
        out.write("\n")
    steps = len(result.new_ids) - 1  # the first new token comes from the prompt's pass
    fused = "" if args.no_fuse else f", q/k/v and gate/up fused: {products} products"
    print(
        f"generate: backend {_backend_line(backend)}{fused}, {forward} forward; "
        f"loaded in {load_seconds:.1f} s; "
        f"prompt {len(ids)} tokens{' (chat template)' if chat else ''} in "
        f"{result.prefill_seconds:.2f} s; {len(result.new_ids)} new tokens, decode "
        f"{_rate(steps, result.decode_seconds)}"
        + (f" ({result.decode_seconds / steps:.3f} s/token)" if steps else ""),
        file=err,
    )
    if args.profile and steps:
        verbs = timed.seconds - at_first_token[0][0]
        calls = timed.calls - at_first_token[0][1]
        total = result.decode_seconds
        share = verbs / total if total > 0 else 0.0
        head = ""
        if lean is not None:
            head_s = lean.head_seconds - at_first_token[0][2]
            head = f", {head_s:.3f} s ({100 * head_s / total:.0f}%) in the float lm_head"
        print(
            f"generate: profile: decode {total:.3f} s, of which "
            f"{verbs:.3f} s ({100 * share:.0f}%) inside backend verbs "
            f"({calls // steps} calls per token){head}",
            file=err,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``nvfp4-generate`` command: ``generate``'s arguments, without the sub-command."""
    parser = argparse.ArgumentParser(
        prog="nvfp4-generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
