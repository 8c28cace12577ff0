"""What a weight's logical shape ``(E?, N, K)`` says, for every record that carries one
(prepared handles, backend weights, checkpoint entries)."""

from __future__ import annotations

__all__ = ["WeightShape"]


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
