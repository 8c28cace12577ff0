"""Command line: ``python -m nvfp4_conformance run | generate``.

``run [--backend NAME] [--certificate PATH] [--spec VERSION] [-- PYTEST ARGS]``
    Certify a backend: runs the shipped tiers (``pytest --pyargs nvfp4_conformance.tiers``)
    with the package's own pytest configuration, so the caller's ``pytest.ini`` or
    ``pyproject.toml`` cannot change the suite. Exit status is pytest's (0 = certified).

``generate --checkpoint PATH [--backend NAME] (--prompt TEXT | --prompt-ids 1,2,3)``
    Greedy generation from an NVFP4 checkpoint (a ModelOpt, compressed-tensors or MLX
    folder, or a GGUF file) of a transformers causal LM with every NVFP4 linear on the
    backend: ``--prompt`` prints the reply (through the chat template) and the speed;
    ``--prompt-ids`` prints ``{"new_ids": [...]}`` as JSON. T6 certifies this code path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]


def generate_doc() -> str:
    """The generate module's docstring (its help), without importing torch."""
    from . import generate

    return generate.__doc__ or ""


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
    from . import generate

    return generate.run(args)


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

    gen = sub.add_parser(
        "generate",
        help="greedy generation from an NVFP4 checkpoint (any flavour) on a backend",
        description=generate_doc(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .generate import add_arguments

    add_arguments(gen)

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
