"""nvfp4_torch.parity: the figures that compare greedy runs."""

from __future__ import annotations

import numpy as np
import pytest
from nvfp4_torch import parity


def test_quality_figures() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 11)).astype(np.float32)
    q = parity.quality_figures(a, a, list(np.argmax(a, axis=-1)))
    assert q == {
        "top1_agreement_vs_float32": 1.0,
        "mean_kl_float32_to_nvfp4": pytest.approx(0.0, abs=1e-12),
    }
    b = a.copy()
    b[0] = 0.0  # uniform
    a0 = a[0].astype(np.float64)
    p = np.exp(a0 - a0.max())
    p /= p.sum()
    kl0 = float(np.sum(p * (np.log(p) - np.log(1 / 11))))
    assert parity.mean_kl(a, b) == pytest.approx(kl0 / 5, rel=1e-9)


def test_activation_quality_figures() -> None:
    rng = np.random.default_rng(1)
    w16 = rng.standard_normal((6, 13)).astype(np.float32)
    same = parity.activation_quality(w16, w16, w16)
    assert same["mean_kl_w4a16_to_mode"] == pytest.approx(0.0, abs=1e-12)
    assert same["top1_agreement_vs_w4a16"] == 1.0
    f32 = w16.copy()
    f32[:3] = -f32[:3]  # a different top-1 on (almost surely) every one of 3 steps
    mode = w16.copy()
    mode[0] = 0.0  # uniform on step 0: its argmax is token 0
    q = parity.activation_quality(w16, f32, mode)
    assert q["mean_kl_w4a16_to_mode"] == pytest.approx(parity.mean_kl(w16, mode))
    assert q["mean_kl_float32_to_mode"] == pytest.approx(parity.mean_kl(f32, mode))
    assert q["mean_kl_w4a16_to_mode"] > 0
    top = np.argmax(mode, axis=-1)
    assert q["top1_agreement_vs_w4a16"] == np.mean(top == np.argmax(w16, axis=-1))
    assert q["top1_agreement_vs_float32"] == np.mean(top == np.argmax(f32, axis=-1))
    assert q["top1_agreement_vs_float32"] < 1.0
