"""nvfp4-torch provides the ``smollm2`` example model of ``nvfp4 example-checkpoint``."""

from __future__ import annotations

import importlib.metadata


def test_smollm2_is_registered_as_an_example_model() -> None:
    from nvfp4_checkpoints.examples import ENTRY_POINT_GROUP, available_models
    from nvfp4_torch import smollm2

    (ep,) = [
        e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == "smollm2"
    ]
    assert ep.load() is smollm2.example_checkpoint
    assert "smollm2" in available_models()
