"""DueRanks against a plain model: the ranks a scan takes and the earliest due time are
those of a dict of every rank's latest due time, whatever the order of schedules, takes
and look-ups (times on bucket edges, rescheduled to the same or an earlier time, the
entries left behind compacted away)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rankguard.monitor.verdicts.due import DueRanks


def _started(n: int) -> tuple[DueRanks, dict[int, Any]]:
    """n ranks seen (their first records) and the first scan, which takes every rank."""
    ranks = {r: SimpleNamespace(rank=r) for r in range(n)}
    due = DueRanks(incremental=True)
    for r in ranks:
        due.changed(r, None)
    assert len(due.take(0.0, ranks)) == n
    return due, ranks


class _Model:
    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.every: set[int] = set()
        self.dirty: set[int] = set()

    def schedule(self, rank: int, when: float, now: float) -> None:
        if not when > now:  # at or before now, or not a time at all: every scan
            self.every.add(rank)
            self.at.pop(rank, None)
            return
        self.every.discard(rank)
        if when == math.inf:
            self.at.pop(rank, None)
        else:
            self.at[rank] = when

    def take(self, now: float) -> set[int]:
        due = self.dirty | self.every | {r for r, w in self.at.items() if w <= now}
        for r in due:
            if r in self.at and self.at[r] <= now:
                del self.at[r]
        self.dirty = set()
        return due

    def earliest(self) -> float | None:
        return min(self.at.values(), default=None)


# times on a grid of 1/64 s (on and between the buckets' edges), some exactly equal
_TIME = st.integers(min_value=-64, max_value=64 * 40).map(lambda k: k / 64)
_OP = st.one_of(
    st.tuples(st.just("schedule"), st.integers(0, 11), _TIME),
    st.tuples(st.just("schedule"), st.integers(0, 11), st.just(math.inf)),
    st.tuples(st.just("schedule"), st.integers(0, 11), st.just(math.nan)),
    st.tuples(st.just("changed"), st.integers(0, 11), st.just(0.0)),
    st.tuples(st.just("advance"), st.integers(0, 3), st.integers(0, 200).map(lambda k: k / 64)),
    st.tuples(st.just("earliest"), st.just(0), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_OP, max_size=120))
def test_the_ranks_taken_and_the_earliest_due_are_the_models(ops: list[Any]) -> None:
    due, ranks = _started(12)
    model = _Model()
    now = 0.0
    for op, rank, value in ops:
        if op == "schedule":
            due.schedule(ranks[rank], value, now)
            model.schedule(rank, value, now)
        elif op == "changed":
            due.changed(rank, None)
            model.dirty.add(rank)
        elif op == "advance":
            now += value
            taken = due.take(now, ranks)
            assert len(taken) == len({s.rank for s in taken})
            assert {s.rank for s in taken} == model.take(now)
            # in the ranks' first-seen order, as a full evaluation sees them
            order = [s.rank for s in taken]
            assert order == sorted(order)  # the order they were first seen in
        else:
            assert due.earliest() == model.earliest()
    assert due.earliest() == model.earliest()


def test_entries_replaced_since_are_dropped_and_every_rank_keeps_its_latest_time() -> None:
    due, ranks = _started(3)
    for step in range(20_000):  # far more entries than ranks: compacted as it goes
        due.schedule(ranks[step % 3], 100.0 + step / 1000, 0.0)
    assert due._entries <= 4 * 3 + 1024 + 1
    # latest times: rank 0 at step 19,998, rank 1 at 19,999, rank 2 at 19,997
    assert due.earliest() == 100.0 + 19_997 / 1000
    assert {s.rank for s in due.take(100.0 + 19_997 / 1000, ranks)} == {2}
    assert due.earliest() == 100.0 + 19_998 / 1000
    assert {s.rank for s in due.take(1e9, ranks)} == {0, 1}
    assert due.earliest() is None


def test_a_time_that_is_no_time_is_judged_at_every_scan() -> None:
    due, ranks = _started(2)
    due.schedule(ranks[0], math.nan, 0.0)
    due.schedule(ranks[1], 1e308, 0.0)  # past any clock's float range once in buckets
    assert {s.rank for s in due.take(0.5, ranks)} == {0, 1}
    assert {s.rank for s in due.take(1.0, ranks)} == {0, 1}
