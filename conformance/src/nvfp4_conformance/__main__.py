"""Command line: ``python -m nvfp4_conformance run | generate``.

``run [--backend NAME] [--certificate PATH] [--spec VERSION] [-- PYTEST ARGS]``
    Certify a backend: runs the shipped tiers (``pytest --pyargs nvfp4_conformance.tiers``)
    with the package's own pytest configuration, so the caller's ``pytest.ini`` or
    ``pyproject.toml`` cannot change the suite. Exit status is pytest's (0 = certified).

``generate --checkpoint DIR --backend NAME --prompt-ids 1,2,3 [--max-new-tokens 40]``
    Greedy decoding of a ModelOpt NVFP4 checkpoint (config.json + safetensors) of a
    Llama-architecture model with every NVFP4 linear on the backend; prints
    ``{"new_ids": [...]}`` as JSON on stdout. T6 certifies this code path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    # pytest runs in a fresh interpreter: this one has imported nvfp4_conformance already
    # (``python -m`` imports the package before __main__), and a module imported before
    # pytest registers its assertion rewriting cannot be rewritten - pytest would warn
    # ("Module already imported so cannot be rewritten") and the plugin's and tiers'
    # asserts would lose their explanations. There, the plugin is imported by pytest.
    tiers_dir = Path(__file__).resolve().parent / "tiers"
    pytest_args = [
        "--pyargs",
        "nvfp4_conformance.tiers",
        "-c",
        str(tiers_dir / "pytest.ini"),
        "--rootdir",
        str(tiers_dir),
        f"--nvfp4-backend={args.backend}",
    ]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        pytest_args += ["-p", "nvfp4_conformance.plugin"]
    if args.certificate:
        pytest_args.append(f"--nvfp4-certificate={Path(args.certificate).resolve()}")
    if args.spec:
        pytest_args.append(f"--nvfp4-spec={args.spec}")
    cmd = [sys.executable, "-m", "pytest", *pytest_args, *extra]
    return subprocess.run(cmd, check=False).returncode


def _generate(args: argparse.Namespace) -> int:
    import nvfp4
    from nvfp4.registry import BackendUnavailable

    try:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    except ValueError:
        print(
            f"--prompt-ids: expected comma-separated integers, found {args.prompt_ids!r}",
            file=sys.stderr,
        )
        return 2
    if not ids:
        print("--prompt-ids: at least one token id is needed", file=sys.stderr)
        return 2
    if args.max_new_tokens < 1:
        print(f"--max-new-tokens: expected >= 1, found {args.max_new_tokens}", file=sys.stderr)
        return 2
    try:
        backend = nvfp4.get_backend(args.backend)
    except BackendUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    from . import llm

    loaded = llm.load_model(args.checkpoint, backend)
    vocab = int(getattr(loaded.model.config, "vocab_size", 0) or 0)
    bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
    if bad:
        print(
            f"--prompt-ids: ids {bad[:5]} are outside the vocabulary [0, {vocab})", file=sys.stderr
        )
        return 2
    result = llm.greedy(loaded.model, ids, args.max_new_tokens)
    print(json.dumps({"new_ids": result.new_ids}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvfp4_conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="certify a backend (runs tiers T0-T6)")
    run.add_argument(
        "--backend",
        default=os.environ.get("NVFP4_BACKEND") or None,
        help="backend entry-point name (reference, cpu, metal, cuda, rocm, or a third "
        "party's); default: $NVFP4_BACKEND",
    )
    run.add_argument("--certificate", help="write the certificate JSON here (and a .md twin)")
    run.add_argument("--spec", help="spec version to certify (default: newest in common)")

    gen = sub.add_parser("generate", help="greedy decoding of a ModelOpt NVFP4 checkpoint")
    gen.add_argument(
        "--checkpoint", required=True, type=Path, help="ModelOpt NVFP4 checkpoint directory"
    )
    gen.add_argument("--backend", default=None, help="backend name (default: the best available)")
    gen.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    gen.add_argument("--max-new-tokens", type=int, default=40)

    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        if not args.backend:
            parser.error("run: --backend NAME is required (or set NVFP4_BACKEND)")
        if extra and extra[0] == "--":
            extra = extra[1:]
        return _run(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return _generate(args)


if __name__ == "__main__":
    raise SystemExit(main())
