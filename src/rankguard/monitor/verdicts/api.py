"""The verdicts' contract: what a verdict reads of the job (:class:`JobView`), the two
kinds of verdict, and how they are composed.

A job verdict (:class:`Verdict`) looks at the job as a whole once per scan where it is
due: the ranks never seen, the rank pass, the culprit of a stall. A rank verdict
(:class:`RankVerdict`) judges one rank at a time, in order: the first that settles the
rank's state (stale, heartbeats late, in a section, progress) ends its turn, then each
check of a live rank runs (its GPU's health). Each verdict says when it is next due
(a job verdict: at which scan; a rank verdict: when the rank's age may cross one of its
thresholds), so a scan evaluates only what can have changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.due import DueRanks
    from rankguard.schema.cadence import Cadence
    from rankguard.schema.findings import Finding
    from rankguard.schema.jsontypes import JsonObject
    from rankguard.schema.records import HeartbeatRecord
    from rankguard.util.disk import DiskState

__all__ = ["Compose", "HealthLookup", "JobView", "RankVerdict", "Verdict"]

#: A rank's GPU health snapshot from its latest record (None: none known).
HealthLookup = Callable[["HeartbeatRecord"], "JsonObject | None"]


class JobView(Protocol):
    """What a verdict reads of the job (the rules' state); it changes only the states
    of the ranks it judges."""

    @property
    def run_id(self) -> str: ...

    @property
    def cadence(self) -> Cadence: ...

    @property
    def fresh_s(self) -> float: ...

    @property
    def ranks(self) -> dict[int, RankState]: ...

    @property
    def disks(self) -> dict[int | None, tuple[DiskState, float | None]]: ...

    @property
    def stalled(self) -> set[int]:
        """The ranks whose last evaluation left them stalled (a superset: a rank reset
        or retired since may remain until the stall verdict runs)."""
        ...

    @property
    def due_ranks(self) -> DueRanks:
        """Which ranks a scan evaluates (the rank pass)."""
        ...

    @property
    def health_for(self) -> HealthLookup | None:
        """This scan's lookup of a rank's GPU health."""
        ...

    def world_size(self) -> int: ...

    def failure_order(self, state: RankState) -> tuple[int, int]:
        """The likelier cause first, among the ranks due."""
        ...

    def evaluate_rank(self, state: RankState, now: float) -> list[Finding]:
        """Rank ``state``'s turn: its ages, its end, then the rank verdicts."""
        ...

    def judge_rank(self, state: RankState, now: float) -> tuple[list[Finding], float]:
        """Rank ``state``'s turn and when it is due again: :meth:`evaluate_rank`, then
        :meth:`next_due_of` (a rank that only advanced is judged in one step)."""
        ...

    def next_due_of(self, state: RankState) -> float:
        """When rank ``state`` is due again without a new record."""
        ...

    def recount(self, rank: int) -> None:
        """Rank ``rank``'s state changed outside its turn: counted again for the
        status (:class:`~rankguard.monitor.tally.Tally`)."""
        ...

    def rank_failed(self, rank: int) -> None:
        """Evaluating ``rank`` raised (logged, counted; it is due again)."""
        ...

    def anchor(self) -> float:
        """Since when (monitor clock) every rank is expected: the first rank seen, or
        the monitor's start while none has been (with ``--preload``: the ranks' fork,
        inf while the launcher waits for its fork server)."""
        ...

    def any_seen(self) -> bool:
        """A rank of the job has published: :meth:`anchor` is its first record, not the
        monitor's start."""
        ...

    def ranks_forked(self) -> bool:
        """``--preload``: the launcher told when it forked the ranks (the fork server
        had imported): while none has published, :meth:`anchor` is that fork."""
        ...


class Verdict(Protocol):
    """A verdict about the job as a whole, evaluated at the scans where it is due."""

    def next_due(self, view: JobView, now: float) -> float:
        """The earliest monitor time at which :meth:`evaluate` may find something
        (-inf: at every scan, inf: not until the job changes)."""
        ...

    def evaluate(self, view: JobView, now: float) -> list[Finding]: ...


class RankVerdict(Protocol):
    """A verdict about one rank, asked in turn for each rank due at a scan."""

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        """Judge rank ``s`` (its ages set for ``now``), findings into ``out``; True when
        this verdict settled the rank's state (the settling verdicts after it are not
        asked)."""
        ...

    def due(self, view: JobView, s: RankState) -> float:
        """The earliest monitor time at which this verdict may judge live rank ``s``
        otherwise without a new record (-inf: at every scan, inf: never)."""
        ...


class Compose:
    """Job verdicts run in order, each only at the scans where it is due."""

    __slots__ = ("verdicts",)

    def __init__(self, *verdicts: Verdict) -> None:
        self.verdicts = verdicts

    def evaluate(self, view: JobView, now: float) -> list[Finding]:
        out: list[Finding] = []
        for verdict in self.verdicts:
            if verdict.next_due(view, now) <= now:
                out.extend(verdict.evaluate(view, now))
        return out
