"""The rank verdicts composed: one rank's turn (:class:`RankVerdicts`) and the pass over
the ranks due at a scan (:class:`RankPass`, a job verdict)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.health import GpuHealth
from rankguard.monitor.verdicts.liveness import HeartbeatsLate, ProcessStale
from rankguard.monitor.verdicts.progress import ProgressTimeout
from rankguard.monitor.verdicts.sections import SectionTimeout
from rankguard.schema.findings import Liveness

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView, RankVerdict
    from rankguard.schema.findings import Finding

__all__ = ["RankPass", "RankVerdicts"]


class RankVerdicts:
    """A live rank's turn: the settling verdicts in order until one settles it, then
    the checks of a live rank. Its due time is the earliest of theirs."""

    __slots__ = ("_dues", "checks", "settle")

    def __init__(
        self,
        settle: tuple[RankVerdict, ...] | None = None,
        checks: tuple[RankVerdict, ...] | None = None,
    ) -> None:
        """``settle`` and ``checks`` in order (None: rankguard's own)."""
        if settle is None:
            settle = (ProcessStale(), HeartbeatsLate(), SectionTimeout(), ProgressTimeout())
        self.settle = settle
        self.checks = checks if checks is not None else (GpuHealth(),)
        self._dues = tuple(v.due for v in (*self.settle, *self.checks))

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> None:
        """Judge live (not ended) rank ``s``, its ages set for ``now``."""
        for verdict in self.settle:
            if verdict.evaluate(view, s, now, out):
                break
        if s.liveness is Liveness.ALIVE:
            for verdict in self.checks:
                verdict.evaluate(view, s, now, out)

    def due(self, view: JobView, s: RankState) -> float:
        """The earliest monitor time at which evaluating rank ``s`` again could give
        another verdict without a new record: for a live rank with a given record, time
        only pushes its ages up across a threshold (the process timeout, fresh_s, the
        progress or a section's timeout), and once across, the verdict stays until the
        next record (the stall's age moves on in :meth:`DueRanks.age_others`);
        conservative, as earlier is only slower, never wrong."""
        due = math.inf
        for due_of in self._dues:
            when = due_of(view, s)
            if when < due:
                due = when
        return due - 1e-6  # never after the crossing, whatever the rounding


class RankPass:
    """Every scan: the ranks due (a new record, their node changed, their due time came;
    every rank without incremental rules), earliest failure first, each in isolation;
    the others' ages move on."""

    __slots__ = ()

    def next_due(self, view: JobView, now: float) -> float:
        return -math.inf  # the ages of every rank move on at each scan

    def evaluate(self, view: JobView, now: float) -> list[Finding]:
        job = view
        findings: list[Finding] = []
        due_ranks = job.due_ranks
        stalled = job.stalled
        health_for = job.health_for
        # Earliest failure first: when a rank fails, its peers fail in their next
        # collective or are terminated by the launcher: consequences, not culprits.
        for state in sorted(due_ranks.take(now, job.ranks), key=job.failure_order):
            if state.record is None:
                continue
            try:  # each rank in isolation: one rank's surprise never hides the others
                state.gpu_health = health_for(state.record) if health_for else None
                findings.extend(job.evaluate_rank(state, now))
            except Exception:
                due_ranks.again(state.rank)
                job.rank_failed(state.rank)
            else:
                due_ranks.schedule(state, job.next_due_of(state), now)
            finally:
                if state.stall is not None:
                    stalled.add(state.rank)
                else:
                    stalled.discard(state.rank)
        due_ranks.age_others(now, job.ranks)
        return findings
