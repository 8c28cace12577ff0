"""The whole-model T6 run of llama.cpp (collected where llama.cpp, torch and the T6 model are
installed; `NVFP4_REQUIRE_ENGINES=llama.cpp`, as `nox -s "engines_t6(engine='llama.cpp')"` sets,
makes their absence an error): built, converted and generated here, it must give the
tokens and the verdict of the committed results."""

from __future__ import annotations

from pathlib import Path

from whole_model_helpers import check_against_committed


def test_whole_model_run_matches_the_committed_results(tmp_path: Path) -> None:
    check_against_committed("llama.cpp", tmp_path)
