"""nvfp4_torch.decode.activation_mode on a tiny Llama written as a ModelOpt NVFP4 checkpoint
and loaded through the ``generate`` code path: inside the block every NVFP4 linear computes
in the mode's verb, and each one's mode is restored on exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


class _Spy:
    """A backend that counts the verbs its NVFP4 linears call."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name.startswith(("qmm", "gather_qmm")):

            def counted(*a: Any, **kw: Any) -> Any:
                self.calls[name] = self.calls.get(name, 0) + 1
                return attr(*a, **kw)

            return counted
        return attr


MODES = {"w4a4": "qmm_w4a4", "w4a8": "qmm_w4a8", "w4a8_fp8": "qmm_w4a8_fp8"}


def test_activation_mode_switches_every_linear_and_restores(tiny_checkpoint: Path) -> None:
    import nvfp4
    from nvfp4_torch import decode, loader, parity

    spy = _Spy(nvfp4.get_backend("reference"))
    loaded = loader.load_model(tiny_checkpoint, spy)
    model = loaded.model
    linears = len(loaded.quantized)
    assert linears == 14
    prompt, ids = [1, 5, 9, 2], [7, 3, 11, 40, 2, 6]
    w16 = decode.teacher_forced_logits(model, prompt, ids)
    assert spy.calls == {"qmm": linears}  # one forward pass: each linear once
    for mode, verb in MODES.items():
        spy.calls.clear()
        with decode.activation_mode(model, mode) as switched:
            logits = decode.teacher_forced_logits(model, prompt, ids)
        assert switched == linears
        assert spy.calls == {verb: linears}, (mode, spy.calls)
        assert np.isfinite(logits).all()
        assert not np.array_equal(logits, w16), f"{mode}: the activations were not quantized"
        q = parity.activation_quality(w16, w16, logits)
        assert 0 < q["mean_kl_w4a16_to_mode"] < 1, (mode, q)
    spy.calls.clear()
    again = decode.teacher_forced_logits(model, prompt, ids)
    assert spy.calls == {"qmm": linears}
    np.testing.assert_array_equal(again, w16)


def test_activation_mode_refuses_an_unknown_mode(tiny_checkpoint: Path) -> None:
    import nvfp4
    from nvfp4_torch import decode, loader

    model = loader.load_model(tiny_checkpoint, nvfp4.get_backend("reference")).model
    with (
        pytest.raises(
            ValueError,
            match=r"activations: expected one of w4a16, w4a4, w4a8, w4a8_fp8, found 'w4a2'",
        ),
        decode.activation_mode(model, "w4a2"),
    ):
        pass  # pragma: no cover - the switch refuses before the block runs
    # a refused switch leaves every linear as it was
    with decode.activation_mode(model, "w4a16"):
        pass
    from nvfp4_torch.modules import NVFP4Linear

    assert {m.activations for m in model.modules() if isinstance(m, NVFP4Linear)} == {"w4a16"}
