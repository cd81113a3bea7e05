"""A data iterator that can replay the current iteration's batches.

Wrap the loop's iterator once (``batches = rerun.replay(loader)``) and draw from the
wrapper. The state machine marks each iteration's start (:meth:`advance`: forget the
previous batches, record the new ones) and asks for a replay (:meth:`rewind`). Batches
are kept by reference until the next iteration: do not modify them in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["RerunDataIterator"]


class RerunDataIterator:
    __slots__ = ("_drop", "_pos", "_replaying", "_saved", "_source")

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._source: Iterator[Any] = iter(iterable)
        self._saved: list[Any] = []
        self._replaying = False
        self._pos = 0
        self._drop = 0  # source batches replaced by replayed ones from a saved state

    def __iter__(self) -> RerunDataIterator:
        return self

    def __next__(self) -> Any:
        if self._replaying:
            if self._pos < len(self._saved):
                batch = self._saved[self._pos]
                self._pos += 1
                return batch
            self._replaying = False  # the iteration draws more than it did the first time
        while self._drop:
            self._drop -= 1
            next(self._source)  # the resumed pipeline's copy of a replayed batch
        batch = next(self._source)
        self._saved.append(batch)
        return batch

    def advance(self) -> None:
        """A new iteration starts: forget the last one's batches."""
        self._saved = []
        self._replaying = False
        self._pos = 0

    def rewind(self) -> None:
        """Serve this iteration's batches again, in order."""
        self._replaying = True
        self._pos = 0

    @property
    def batches(self) -> list[Any]:
        """This iteration's batches so far (what the rerun state file keeps)."""
        return list(self._saved)

    def load_batches(self, batches: list[Any]) -> None:
        """A resumed job: serve ``batches`` (saved by the first run) for the re-run
        iteration, and skip as many from the source, which resumed at that iteration."""
        self._saved = list(batches)
        self._replaying = True
        self._pos = 0
        self._drop = len(batches)
