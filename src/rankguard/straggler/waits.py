"""Node 0: each rank's compute per step from how long it waited in collectives.

In a data-parallel job the gradient all-reduce makes every rank's step as long as the
slowest rank's: step timing cannot tell them apart, and a rank slowed inside forward or
backward needs no code mark to be found here. Each rank's sampler
(:mod:`rankguard.ft.collectives`) counts how often it found the rank inside a collective;
over a report interval that is the rank's waiting share ``w``. The rank the others wait
for arrives last and waits least. With ``P`` the job's step period over the interval
(from the ranks' step counts, on the monitor's clock), a rank's compute per step is
``P * (1 - w)``: the slow rank's is the whole step, the others' the step less their
wait. Its ratio to the faster half of the ranks' (their median) is the rank's slowdown.

The estimate needs the flight recorder (``rankguard run`` turns it on), an interval that
none of the ranks started in, and enough samples (:data:`MIN_SAMPLES` per rank per
interval, 50 ms apart); without them the ranks' own measurements stay the source. Time
inside a collective counts as waiting even while the rank still computes beside it
(DDP's all-reduce of a gradient bucket runs during the rest of backward): a rank's
collectives wait as long as its slowest peer keeps them waiting, so the ranking holds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rankguard.schema.blocks import read_block
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.records import HeartbeatRecord

__all__ = ["MIN_SAMPLES", "RankWaits", "WaitShares"]

MIN_SAMPLES = 20  # sampler looks per rank and interval (one second at 50 ms)


@dataclass(frozen=True, slots=True)
class _Mark:
    pid: int
    samples: int
    waiting: int
    steps: int
    at: float  # monitor clock


@dataclass(frozen=True, slots=True)
class RankWaits:
    """One rank over one interval."""

    wait_share: float
    compute_ms: float  # per step: the job's step period less the rank's waiting


class WaitShares:
    """Each rank's waiting share since the last :meth:`take`."""

    def __init__(self) -> None:
        self._start: dict[int, _Mark] = {}
        self._latest: dict[int, _Mark] = {}
        self._fresh: set[int] = set()  # ranks first seen (or restarted) this interval
        #: the interval the last :meth:`take` ended held a rank's start (no estimate)
        self.held_start = False

    def observe(self, rank: int, rec: HeartbeatRecord, now: float) -> None:
        if CollectivesBlock.name not in rec.extra:
            return
        try:
            block = read_block(rec, CollectivesBlock)
        except ValueError:
            return
        if block is None:
            return
        mark = _Mark(rec.pid, block.samples, block.waiting, rec.progress_seq, now)
        start = self._start.get(rank)
        if start is None or start.pid != rec.pid:  # first sight, or a restarted rank
            self._start[rank] = mark
            self._fresh.add(rank)
        self._latest[rank] = mark

    def forget(self, rank: int) -> None:
        self._start.pop(rank, None)
        self._latest.pop(rank, None)
        self._fresh.discard(rank)

    def take(self) -> dict[int, RankWaits]:
        """The interval's estimate for every rank (empty when a rank has too few
        samples, no step was made, or a rank started in it); the next interval starts
        now. A rank's first interval holds its start: its peers waited in their first
        collectives for the last rank to arrive there, not for its compute."""
        out: dict[int, RankWaits] = {}
        periods = []
        shares: dict[int, float] = {}
        self.held_start = bool(self._fresh)
        if self._fresh:
            self._fresh = set()
            self._start = dict(self._latest)
            return out
        for rank, end in self._latest.items():
            start = self._start[rank]
            looks = end.samples - start.samples
            if looks < MIN_SAMPLES:
                shares.clear()
                break
            shares[rank] = (end.waiting - start.waiting) / looks
            if end.steps > start.steps and end.at > start.at:
                periods.append((end.at - start.at) / (end.steps - start.steps))
        self._start = dict(self._latest)
        if len(shares) < 2 or not periods:
            return out
        period_ms = statistics.median(periods) * 1000.0
        for rank, w in shares.items():
            out[rank] = RankWaits(w, period_ms * max(1.0 - w, 0.01))
        return out
