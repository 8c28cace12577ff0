"""The random-corpus rule of T2 (spec 1.0 and 1.1, "Conformance of other encoders"): over
2^20 random elements and more, the fraction of boundary disagreements is within the table's
``others`` (``reference``, 0, for the reference backend)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CorpusTally"]

#: The fewest random elements a corpus may hold.
MIN_ELEMENTS = 2**20


class CorpusTally:
    """The elements and boundary disagreements of a random corpus, case by case."""

    def __init__(self) -> None:
        self.elements = 0
        self.disagreements = 0

    def add(self, figures: Mapping[str, Any]) -> None:
        """Count one case's comparison figures (``elements``, ``disagreements``)."""
        self.elements += figures["elements"]
        self.disagreements += figures["disagreements"]

    def judge(
        self,
        record: Callable[..., None],
        tolerance: Callable[[str, Any], float],
        *,
        table: str,
        exact: bool,
        unit: str,
    ) -> None:
        """Record the corpus's figures as case ``random corpus`` and assert the fraction is
        within ``[table] reference`` (``exact``) or ``[table] others``; ``unit`` names the
        compared elements in the failure message."""
        row = "reference" if exact else "others"
        limit = tolerance(table, row)
        fraction = self.disagreements / self.elements
        record(
            "random corpus",
            elements=self.elements,
            disagreements=self.disagreements,
            disagreement_fraction=fraction,
            tolerance=limit,
        )
        assert self.elements >= MIN_ELEMENTS, (
            f"the random corpus has {self.elements} elements, the spec asks for 2^20"
        )
        assert fraction <= limit, (
            f"{self.disagreements} boundary disagreements in {self.elements} random {unit}: "
            f"fraction {fraction:.3g} > {limit:g} ([{table}] {row})"
        )
