"""The pass over the ranks due at a scan (:class:`RankPass`, a job verdict)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["RankPass"]


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
