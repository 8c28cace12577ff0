"""The context-manager protocol of the package's readers and writers, once.

``with obj:`` closes ``obj`` when the block ends normally; when the block raises, it calls
:meth:`Closing.abort` instead, which a writer overrides so that its partial output never
lands (a reader's abort is its close)."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["Closing"]

_T = TypeVar("_T", bound="Closing")


class Closing:
    """Mixin: ``__enter__`` / ``__exit__`` over :meth:`close` and :meth:`abort`."""

    def close(self) -> None:
        """Release what the object holds (default: nothing)."""

    def abort(self) -> None:
        """Give up after an error (default: :meth:`close`)."""
        self.close()

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
