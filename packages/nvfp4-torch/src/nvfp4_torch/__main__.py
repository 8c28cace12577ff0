"""Command line: ``python -m nvfp4_torch generate ...`` (also installed as ``nvfp4-generate``).

``generate --checkpoint PATH [--backend NAME] (--prompt TEXT | --prompt-ids 1,2,3)``
    Greedy generation from an NVFP4 checkpoint (a ModelOpt, compressed-tensors or MLX
    folder, or a GGUF file) of a transformers causal LM with every NVFP4 linear on a
    backend: ``--prompt`` prints the reply (through the chat template) and the speed;
    ``--prompt-ids`` prints ``{"new_ids": [...]}`` as JSON. ``generate --help`` has every
    option.
"""

from __future__ import annotations

import argparse

from . import generate

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvfp4_torch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="greedy generation from an NVFP4 checkpoint (any flavour) on a backend",
        description=generate.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_arguments(gen)
    args = parser.parse_args(argv)
    return generate.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
