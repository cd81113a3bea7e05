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

_PER_S = 16  # buckets of due times per second of the monitor's clock


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
        "_buckets",
        "_dirty",
        "_entries",
        "_every",
        "_keys",
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
        self._at: dict[int, float] = {}  # rank -> its due time (when in a bucket)
        # The due times, by bucket of 1/_PER_S s: most records of a large job move their
        # rank's due time on (a new entry; the old one left behind, skipped when its
        # bucket is reached), so an entry costs an append and a look-up, not a heap's
        # push and pop over every rank's entries (at 100,000 ranks, ~5 us each).
        self._buckets: dict[int, list[tuple[float, int]]] = {}
        self._keys: list[int] = []  # a heap of the buckets' keys
        self._entries = 0  # in all buckets, those replaced since included
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
        keys, buckets, at = self._keys, self._buckets, self._at
        last = math.floor(now * _PER_S)
        while keys and keys[0] <= last:
            key = heapq.heappop(keys)
            entries = buckets.pop(key)
            self._entries -= len(entries)
            if key < last:  # every time in it is before now (a product rounds monotonically)
                for when, rank in entries:
                    if at.get(rank) == when:
                        del at[rank]
                        due.add(rank)
                continue
            later = []
            for entry in entries:
                when, rank = entry
                if at.get(rank) != when:
                    continue  # replaced since
                if when <= now:
                    del at[rank]
                    due.add(rank)
                else:
                    later.append(entry)
            if later:
                self._add_bucket(key, later)
            break
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
            try:
                key = math.floor(when * _PER_S)
            except (ValueError, OverflowError):  # not a time of any clock: at every scan
                self._every.add(rank)
                self._at.pop(rank, None)
                return
            self._at[rank] = when
            bucket = self._buckets.get(key)
            if bucket is None:
                self._add_bucket(key, [(when, rank)])
            else:
                bucket.append((when, rank))
                self._entries += 1
            if self._entries > 4 * len(self._at) + 1024:  # drop entries replaced since
                self._rebuild()

    def _add_bucket(self, key: int, entries: list[tuple[float, int]]) -> None:
        self._buckets[key] = entries
        self._entries += len(entries)
        heapq.heappush(self._keys, key)

    def _rebuild(self) -> None:
        self._buckets, self._keys, self._entries = {}, [], 0
        by_key: dict[int, list[tuple[float, int]]] = {}
        for rank, when in self._at.items():
            by_key.setdefault(math.floor(when * _PER_S), []).append((when, rank))
        for key, entries in by_key.items():
            self._add_bucket(key, entries)

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
        keys, buckets, at = self._keys, self._buckets, self._at
        while keys:
            key = keys[0]
            entries = buckets[key]
            live = [entry for entry in entries if at.get(entry[1]) == entry[0]]
            if live:
                if len(live) < len(entries):
                    buckets[key] = live  # replaced since: dropped
                    self._entries -= len(entries) - len(live)
                return min(live)[0]
            heapq.heappop(keys)
            del buckets[key]
            self._entries -= len(entries)
        return None
