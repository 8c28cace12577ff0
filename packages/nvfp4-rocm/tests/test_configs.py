"""Tile configurations per AMD architecture family: wavefront widths, arch name parsing,
fallbacks and refusals."""

from __future__ import annotations

import pytest
from nvfp4_rocm import configs

CASES = [
    ("gfx940", "cdna3", 64),
    ("gfx942:sramecc+:xnack-", "cdna3", 64),
    ("gfx950", "cdna4", 64),
    ("gfx1100", "rdna3", 32),
    ("gfx1103", "rdna3", 32),
    ("gfx1151", "rdna3", 32),
    ("gfx1200", "rdna4", 32),
    ("GFX1201", "rdna4", 32),
]


@pytest.mark.parametrize(("gcn", "family", "lanes"), CASES)
def test_considered_architectures(gcn: str, family: str, lanes: int) -> None:
    m = configs.match_arch(gcn)
    assert m.considered
    assert m.family.key == family
    assert m.family.lanes == lanes
    cfg = configs.config_for(gcn)
    assert cfg.name == configs.base_arch(gcn)
    assert cfg.lanes == lanes
    assert cfg.gemv.split_k_programs == 2 * m.family.typical_cus
    assert any("not measured" in n for n in cfg.notes)


def test_wavefront_widths_follow_the_isa() -> None:
    """CDNA (gfx9) runs 64-lane wavefronts, RDNA (gfx10+) 32-lane ones: Triton's rule."""
    for family in configs.FAMILIES.values():
        major = int(family.archs[0][3:-2])
        assert family.lanes == (64 if major == 9 else 32), family.key
        cfg = family.config
        for tiles in (cfg.gemv, cfg.gemm, cfg.dequant, cfg.quant, cfg.gather):
            assert tiles.num_warps * cfg.lanes <= 1024


def test_families_are_distinct_where_the_hardware_is() -> None:
    assert configs.CDNA4.config.gemm.block_n > configs.CDNA3.config.gemm.block_n  # 160 KB LDS
    assert configs.CDNA3.config.lanes != configs.RDNA3.config.lanes
    assert set(configs.FAMILIES) == {"cdna3", "cdna4", "rdna3", "rdna4"}


@pytest.mark.parametrize(
    ("gcn", "borrowed"),
    [("gfx90a", "cdna3"), ("gfx908", "cdna3"), ("gfx1030", "rdna3"), ("gfx1250", "rdna4")],
)
def test_unlisted_architectures_borrow_by_isa_major(gcn: str, borrowed: str) -> None:
    m = configs.match_arch(gcn)
    assert not m.considered
    assert m.family.key == borrowed
    cfg = configs.config_for(gcn, 10)
    assert cfg.gemv.split_k_programs == 20
    assert any(f"{gcn} is not one of the considered architectures" in n for n in cfg.notes)


@pytest.mark.parametrize(("gcn", "what"), [("gfx803", "ISA major version 8"), ("sm_90", "gfx")])
def test_refused(gcn: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        configs.match_arch(gcn)


def test_interpreter_flag_only_changes_the_dot_operands() -> None:
    gpu = configs.config_for("gfx942")
    cpu = configs.config_for("gfx942", interpreter=True)
    assert not gpu.dot_in_float32
    assert cpu.dot_in_float32
    assert gpu.with_(dot_in_float32=True) == cpu
