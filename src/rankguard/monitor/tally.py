"""The status counts of a large job kept up to date, not recounted over every rank at
every scan: each rank is counted as it was when last looked at, and a rank whose state
may have changed since is marked (:meth:`Tally.touch`) and counted again at the next
:meth:`Tally.update`, its old share taken off first. The rules mark a rank wherever its
state can change: a record taken in, its turn at a scan, a change outside its turn (an
end held for its cause judged, a process named lost, a stall's culprit named, a
replaced process, a rank retired), so the counts equal a full recount after every scan
(``tests/unit/monitor/test_tally.py`` checks it on random histories).

Kept: ranks per process liveness and per GPU progress, active findings (written for the
process now), ranks observed (with a record), the notable ranks (a finding active,
blocked by another rank, stalled or progress unknown: the first of the worst ranks), and
each rank's progress anchor (first seen minus its seconds without progress: the smaller,
the longer without progress at any scan), from which the longest without progress are
taken without a pass over every rank.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Self

import numpy as np

from rankguard.schema.findings import FindingType, Progress

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.schema.findings import Liveness

__all__ = ["NOTABLE", "FindingSet", "Tally", "notable"]

NOTABLE = frozenset({Progress.STALLED, Progress.UNKNOWN})


def notable(s: RankState) -> bool:
    """A rank listed first among the worst: a finding active, blocked by another rank,
    stalled, or its progress unknown."""
    return bool(s.active or s.blocked_by or s.progress in NOTABLE)


class Tally:
    """Counts over every rank of the rules, up to date after :meth:`update`."""

    __slots__ = (
        "_anchors",
        "_counted",
        "_touched",
        "findings",
        "liveness",
        "notable",
        "observed",
        "progress",
    )

    def __init__(self) -> None:
        # rank -> (liveness, progress, active findings, observed) as last counted
        self._counted: dict[int, tuple[Liveness, Progress, int, bool]] = {}
        self._touched: set[int] = set()
        self.liveness: Counter[Liveness] = Counter()
        self.progress: Counter[Progress] = Counter()
        self.findings = 0
        self.observed = 0
        self.notable: set[int] = set()
        # by rank: its progress anchor (inf: none, no rank state or no progress age)
        self._anchors = np.full(1024, np.inf)

    def touch(self, rank: int) -> None:
        """Rank ``rank``'s state may have changed (or it is gone): counted again."""
        self._touched.add(rank)

    def place(self, rank: int, seen_at: float | None, since: float | None) -> None:
        """Rank ``rank``'s latest record was first seen at ``seen_at`` and says
        ``since`` seconds without progress (None: no progress age)."""
        anchors = self._anchors
        if rank >= len(anchors):
            grown = np.full(max(2 * len(anchors), rank + 1), np.inf)
            grown[: len(anchors)] = anchors
            self._anchors = anchors = grown
        anchors[rank] = np.inf if seen_at is None or since is None else seen_at - since

    def update(self, ranks: dict[int, RankState]) -> None:
        """Count again the ranks touched since the last update."""
        touched, self._touched = self._touched, set()
        counted, liveness, progress = self._counted, self.liveness, self.progress
        for rank in touched:
            old = counted.get(rank)
            s = ranks.get(rank)
            if s is None:
                new = None
                self.notable.discard(rank)
                self.place(rank, None, None)
            else:
                active = s.active
                new = (
                    s.liveness,
                    s.progress,
                    len(active & s.fired) if active else 0,
                    s.record is not None,
                )
                if active or s.blocked_by or new[1] in NOTABLE:
                    self.notable.add(rank)
                else:
                    self.notable.discard(rank)
            if new == old:
                continue
            if old is not None:
                liveness[old[0]] -= 1
                progress[old[1]] -= 1
                self.findings -= old[2]
                self.observed -= old[3]
            if new is None:
                del counted[rank]
                continue
            counted[rank] = new
            liveness[new[0]] += 1
            progress[new[1]] += 1
            self.findings += new[2]
            self.observed += new[3]

    def longest_without_progress(
        self, ranks: dict[int, RankState], n: int, chosen: set[int]
    ) -> list[RankState]:
        """The ``n`` ranks (not in ``chosen``) with the largest progress age, largest
        first (ties: the lower rank), as a pass over every rank would pick them. The
        ranks' ages must be those of the latest scan (none waits for its evaluation)."""
        if n <= 0:
            return []
        anchors = self._anchors
        if chosen:
            anchors = anchors.copy()
            anchors[list(chosen)] = np.inf
        finite = int(np.count_nonzero(np.isfinite(anchors)))
        k = min(n, finite)
        if k == 0:
            return []
        kth = float(np.partition(anchors, k - 1)[k - 1])
        # the ages of anchors this close may be equal or swapped by rounding: each such
        # rank is a candidate, its own age decides
        near = np.flatnonzero(anchors <= kth + 1e-6 * max(1.0, abs(kth)))
        picked = [s for r in near.tolist() if (s := ranks.get(r)) is not None]
        return heapq.nsmallest(n, picked, key=_older_first)


def _older_first(s: RankState) -> tuple[float, int]:
    return -(s.progress_age_s or 0.0), s.rank


class FindingSet(set[FindingType]):
    """A rank's finding types (``RankState.active``, ``fired``) that mark the rank in its
    tally whenever they change, whoever changes them."""

    __slots__ = ("_rank", "_tally")

    def __init__(self, tally: Tally, rank: int) -> None:
        super().__init__()
        self._tally = tally
        self._rank = rank

    def emptied(self) -> FindingSet:
        """A new empty set of the same rank (its process was replaced)."""
        self._tally.touch(self._rank)
        return FindingSet(self._tally, self._rank)

    def _changed(self) -> None:
        self._tally.touch(self._rank)

    def add(self, element: FindingType) -> None:
        super().add(element)
        self._changed()

    def discard(self, element: object) -> None:
        if element in self:
            super().discard(element)
            self._changed()

    def remove(self, element: FindingType) -> None:
        super().remove(element)
        self._changed()

    def pop(self) -> FindingType:
        element = super().pop()
        self._changed()
        return element

    def clear(self) -> None:
        super().clear()
        self._changed()

    def update(self, *s: Iterable[FindingType]) -> None:
        super().update(*s)
        self._changed()

    def difference_update(self, *s: Iterable[object]) -> None:
        super().difference_update(*s)
        self._changed()

    def intersection_update(self, *s: Iterable[object]) -> None:
        super().intersection_update(*s)
        self._changed()

    def symmetric_difference_update(self, s: Iterable[FindingType], /) -> None:
        super().symmetric_difference_update(s)
        self._changed()

    def __ior__(self, value: AbstractSet[FindingType], /) -> Self:  # type: ignore[override,misc]
        super().__ior__(value)
        self._changed()
        return self

    def __iand__(self, value: AbstractSet[object], /) -> Self:
        super().__iand__(value)
        self._changed()
        return self

    def __isub__(self, value: AbstractSet[object], /) -> Self:
        super().__isub__(value)
        self._changed()
        return self

    def __ixor__(self, value: AbstractSet[FindingType], /) -> Self:  # type: ignore[override,misc]
        super().__ixor__(value)
        self._changed()
        return self
