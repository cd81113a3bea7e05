"""Which ranks a scan evaluates: a rank's verdict can change only with a new record, a
change of its node (GPU health), or when its due time comes (the earliest of its rank
verdicts' :meth:`due`); the others' ages move on without an evaluation."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.evidence import stall_age

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = ["DueRanks"]


class DueRanks:
    """Which ranks a scan evaluates: with ``incremental``, those with a new record, of a
    node marked changed, or whose due time (:meth:`RankVerdicts.due`) came;
    without it (and at the first scan), every rank. A rank's verdict depends only on
    its record, the time, its GPU health and the job-wide notes (shutdown, restart,
    root cause, first failure, disks), and those notes matter only to a rank that just
    ended or is stale, which is due anyway: so the verdicts are those of evaluating every
    rank (``tests/unit/monitor/test_incremental.py`` checks it on random histories).
    """

    __slots__ = (
        "_at",
        "_dirty",
        "_every",
        "_heap",
        "_node_ranks",
        "_order",
        "_started",
        "incremental",
    )

    def __init__(self, incremental: bool) -> None:
        self.incremental = incremental
        self._started = False
        self._dirty: set[int] = set()
        self._every: set[int] = set()  # due at every scan
        self._at: dict[int, float] = {}  # rank -> its due time (when in the heap)
        self._heap: list[tuple[float, int]] = []
        self._node_ranks: dict[int | None, set[int]] = {}
        self._order: dict[int, int] = {}  # rank -> when first seen (the ranks' dict order)

    def changed(self, rank: int, node_rank: int | None) -> None:
        self._dirty.add(rank)
        self._order.setdefault(rank, len(self._order))
        ranks = self._node_ranks.get(node_rank)
        if ranks is None:
            ranks = self._node_ranks[node_rank] = set()
        ranks.add(rank)

    def mark_node(self, node_rank: int | None) -> None:
        self._dirty |= self._node_ranks.get(node_rank, set())

    def pending(self) -> bool:
        """A rank has changed since the last scan took the ranks due (a new record not
        evaluated yet: its ages are those before it until then)."""
        return bool(self._dirty)

    def again(self, rank: int) -> None:
        self._every.add(rank)

    def take(self, now: float, ranks: dict[int, RankState]) -> list[RankState]:
        if not (self.incremental and self._started):
            self._started = True
            self._dirty.clear()
            return list(ranks.values())
        due = self._dirty | self._every
        self._dirty = set()
        heap, at = self._heap, self._at
        while heap and heap[0][0] <= now:
            when, rank = heapq.heappop(heap)
            if at.get(rank) == when:
                del at[rank]
                due.add(rank)
        # in the order of the ranks' dict, as a full evaluation sees them (ties of the
        # failure order keep it)
        return [ranks[r] for r in sorted(due, key=self._order.__getitem__) if r in ranks]

    def schedule(self, state: RankState, when: float, now: float) -> None:
        rank = state.rank
        if when <= now:
            self._every.add(rank)
            self._at.pop(rank, None)
            return
        self._every.discard(rank)
        if when == math.inf:
            self._at.pop(rank, None)
        elif self._at.get(rank) != when:
            self._at[rank] = when
            heapq.heappush(self._heap, (when, rank))
            if len(self._heap) > 4 * len(self._at) + 1024:  # drop entries replaced since
                self._heap = [(w, r) for r, w in self._at.items()]
                heapq.heapify(self._heap)

    def age_stalls(self, now: float, ranks: dict[int, RankState], stalled: set[int]) -> None:
        """The stall ages a full evaluation would have set on the stalled ranks not
        evaluated (``stalled``: a superset of them). The heartbeat and progress ages of
        every rank move on by themselves (:class:`~rankguard.monitor.rules.ScanClock`)."""
        if not self.incremental:
            return
        for rank in stalled:
            s = ranks.get(rank)
            if s is None or s.stall is None:
                continue
            age, rec = s.progress_age_s, s.record
            if age is not None and rec is not None:
                s.stall = (s.stall[0], stall_age(s, rec, now, age))

    def earliest(self) -> float | None:
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # replaced since
        return heap[0][0] if heap else None
