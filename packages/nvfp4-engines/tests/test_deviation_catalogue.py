"""The engines' deviation catalogue (``nvfp4_engines.deviations``) and the newest registry
(``spec/1.5/deviations.toml``, read by ``nvfp4.deviation_registry``) name the same
deviations. (Here, not in core's tests: core does not depend on nvfp4-engines.)"""

from __future__ import annotations

from nvfp4 import deviation_registry as reg
from nvfp4_engines.deviations import DEVIATIONS


def test_every_deviation_of_the_engines_catalogue_is_declared() -> None:
    assert {d.key for d in DEVIATIONS} == {d.id for d in reg.deviations()}
