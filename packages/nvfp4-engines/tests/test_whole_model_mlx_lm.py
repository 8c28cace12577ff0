"""The whole-model T6 run of mlx-lm (collected where mlx-lm, torch and the T6 model are
installed; `NVFP4_REQUIRE_ENGINES=mlx-lm`, as `nox -s "engines_t6(engine='mlx-lm')"` sets,
makes their absence an error): built, converted and generated here, it must give the
tokens and the verdict of the committed results."""

from __future__ import annotations

from pathlib import Path

from whole_model_helpers import check_against_committed


def test_whole_model_run_matches_the_committed_results(tmp_path: Path) -> None:
    check_against_committed("mlx-lm", tmp_path)
