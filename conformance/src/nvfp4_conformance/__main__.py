"""Command line: python -m nvfp4_conformance run.

run [--backend NAME] [--certificate PATH] [--spec VERSION] [-- PYTEST ARGS]
    Certify a backend: runs the shipped tiers (pytest --pyargs nvfp4_conformance.tiers)
    with the package's own pytest configuration, so the caller's pytest.ini or
    pyproject.toml cannot change the suite. Exit status is pytest's: 0 when every selected
    test passed (the certificate says certified, or partial when tiers were left out),
    1 when one failed. The certificate's "result" is the verdict.

generate ...
    Deprecated (removed in the next release): moved to nvfp4-torch, python -m nvfp4_torch
    generate (or nvfp4-generate); this forwards its arguments there.
"""

from __future__ import annotations

import argparse
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


def _generate(argv: list[str]) -> int:
    """The deprecated ``generate``: forwarded to nvfp4-torch's command."""
    print(
        "python -m nvfp4_conformance generate is deprecated: use python -m nvfp4_torch "
        "generate (pip install 'nvfp4-torch[models]')",
        file=sys.stderr,
    )
    try:
        from nvfp4_torch.__main__ import main as torch_main
    except ImportError:
        print("generate needs nvfp4-torch: pip install 'nvfp4-torch[models]'", file=sys.stderr)
        return 2
    return torch_main(["generate", *argv])


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

    sub.add_parser(
        "generate",
        help="deprecated: python -m nvfp4_torch generate (this forwards there)",
        add_help=False,
    )

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["generate"]:
        return _generate(argv[1:])
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        if not args.backend:
            parser.error("run: --backend NAME is required (or set NVFP4_BACKEND)")
        if extra and extra[0] == "--":
            extra = extra[1:]
        return _run(args, extra)
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks it
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
