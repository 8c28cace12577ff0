"""``python -m nvfp4_engines.whole_model ENGINE [--out FOLDER] [--workdir DIR]``: run one
engine's whole-model T6 comparison and write ``FOLDER/<engine>.json``."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .engines import ENGINES
from .results import FOLDER, write
from .run import run_engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4_engines.whole_model")
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--out", type=Path, default=Path("reports/engines") / FOLDER)
    parser.add_argument(
        "--workdir", type=Path, help="where the checkpoint and its conversion go (a temporary one)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        doc = run_engine(args.engine, workdir)
    dest = write(doc, args.out)
    s = doc["summary"]
    print(
        f"{args.engine}: {s['tokens_matched']} of {s['tokens_expected']} tokens, {s['verdict']}; "
        f"mean KL {s['mean_kl_reference_to_engine']:.4g}, top-1 {s['top1_agreement']:.4f}, "
        f"max |logit diff| {s['max_abs_logit_diff']:.3g}; {doc['timings_s']['total']:.0f} s; "
        f"wrote {dest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
