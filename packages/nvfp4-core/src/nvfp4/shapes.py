"""What a weight's logical shape ``(E?, N, K)`` says, for every record that carries one
(prepared handles, backend weights, checkpoint entries), and the facts every backend's
prepared weight keeps beside its own layout (:class:`PreparedFacts`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["PreparedFacts", "WeightShape"]


@dataclass(frozen=True, eq=False)
class PreparedFacts:
    """The base of a backend's prepared weight: what the planes said, kept so errors name
    the tensor and ``to_planes`` gives the planes back. A backend's record adds its own
    layout's arrays after these fields.

    Attributes:
        name: the tensor's name (every error names it).
        n, k: output rows (per expert) and contraction length.
        num_experts: ``E`` for an expert stack, else ``None``.
        partitions, global_scale: as in the planes.
    """

    name: str
    n: int
    k: int
    num_experts: int | None
    partitions: tuple[int, ...] | None
    global_scale: npt.NDArray[np.float32]


class WeightShape:
    """Mixin: ``num_experts``, ``n`` and ``k`` from ``self.shape`` (``[N, K]`` or
    ``[E, N, K]``). Defines no slots of its own, so slotted classes stay slotted."""

    __slots__ = ()
    shape: tuple[int, ...]

    @property
    def num_experts(self) -> int | None:
        """``E`` for an expert stack ``[E, N, K]``, else ``None``."""
        return self.shape[0] if len(self.shape) == 3 else None

    @property
    def n(self) -> int:
        """Output rows N."""
        return self.shape[-2]

    @property
    def k(self) -> int:
        """Contraction length K."""
        return self.shape[-1]
