"""The rank verdicts composed: one rank's turn (:class:`RankVerdicts`) and the pass over
the ranks due at a scan (:class:`RankPass`, a job verdict)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.evidence import TRAIN_PHASES, stall_age
from rankguard.monitor.verdicts.health import GpuHealth
from rankguard.monitor.verdicts.liveness import HeartbeatsLate, ProcessStale
from rankguard.monitor.verdicts.progress import ProgressTimeout
from rankguard.monitor.verdicts.sections import SectionTimeout
from rankguard.schema.findings import Liveness, Progress

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView, RankVerdict
    from rankguard.schema.findings import Finding

__all__ = ["RankPass", "RankVerdicts"]


class RankVerdicts:
    """A live rank's turn: the settling verdicts in order until one settles it, then
    the checks of a live rank. Its due time is the earliest of theirs."""

    __slots__ = ("_dues", "checks", "own", "settle")

    def __init__(
        self,
        settle: tuple[RankVerdict, ...] | None = None,
        checks: tuple[RankVerdict, ...] | None = None,
    ) -> None:
        """``settle`` and ``checks`` in order (None: rankguard's own)."""
        self.own = settle is None and checks is None  # :meth:`advanced` knows only these
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

    def advanced(self, view: JobView, s: RankState, now: float) -> float | None:
        """The common case of a large job, judged without asking each verdict: a rank
        in train whose latest record says it is alive and advanced (heartbeats fresh,
        progress within the step timeout, no finding active, no GPU health verdict,
        not saving). Its state is then what the verdicts would set (alive,
        progressing, nothing stalled or late) and its due time theirs (its heartbeats
        turning late, its process timeout, the shortest progress timeout): returned.
        None, with the state untouched, for any other case (the full turn decides).
        Only with rankguard's own verdicts (:attr:`own`); its ages set for ``now``."""
        rec, seen = s.record, s.seen_at
        if (
            rec is None
            or seen is None
            or s.active
            or s.gpu_health
            or rec.ended
            or rec.checkpoint_active
            or rec.phase not in TRAIN_PHASES
            or rec.progress_seq <= 0
            or s.named_silent is rec
        ):
            return None
        since = rec.since_progress_s
        if since is None:
            return None
        cadence = view.cadence
        fresh_at = seen + view.fresh_s
        stale_at = seen + cadence.process_timeout_s
        hb_age = now - seen
        if hb_age > view.fresh_s or hb_age > cadence.process_timeout_s:
            return None
        if stall_age(s, rec, now, hb_age + since) > cadence.step_timeout_s:
            return None
        s.late = False
        s.liveness = Liveness.ALIVE
        s.progress = Progress.PROGRESSING
        s.stall = None
        if s.blocked_by:
            s.blocked_by = []
        s.culprits_gone_at = None
        due = seen - since + cadence.shortest_progress_timeout_s
        due = min(stale_at, fresh_at, due)
        return due - 1e-6  # as :meth:`due`

    def due(self, view: JobView, s: RankState) -> float:
        """The earliest monitor time at which evaluating rank ``s`` again could give
        another verdict without a new record: for a live rank with a given record, time
        only pushes its ages up across a threshold (the process timeout, fresh_s, the
        progress or a section's timeout), and once across, the verdict stays until the
        next record (the stall's age moves on in :meth:`DueRanks.age_stalls`);
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
                found, due = job.judge_rank(state, now)
                if found:
                    findings.extend(found)
            except Exception:
                due_ranks.again(state.rank)
                job.rank_failed(state.rank)
            else:
                due_ranks.schedule(state, due, now)
            finally:
                if state.stall is not None:
                    stalled.add(state.rank)
                else:
                    stalled.discard(state.rank)
        due_ranks.age_stalls(now, job.ranks, stalled)
        return findings
