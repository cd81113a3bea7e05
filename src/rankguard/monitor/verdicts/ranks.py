"""The rank verdicts composed: one rank's turn (:class:`RankVerdicts`) and the pass over
the ranks due at a scan (:class:`RankPass`, a job verdict)."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.evidence import TRAIN_PHASES, stall_age
from rankguard.monitor.verdicts.health import GpuHealth
from rankguard.monitor.verdicts.liveness import HeartbeatsLate, ProcessStale
from rankguard.monitor.verdicts.progress import ProgressTimeout
from rankguard.monitor.verdicts.sections import SectionTimeout
from rankguard.schema.findings import FindingType, Liveness, Progress
from rankguard.schema.records import Event, HeartbeatRecord

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView, RankVerdict
    from rankguard.schema.cadence import Cadence
    from rankguard.schema.findings import Finding

__all__ = ["CLOCK_FIELDS", "RankPass", "RankVerdicts"]

#: The fields of a record that move with time alone while a rank makes no progress (a
#: rank waiting in a collective hang publishes nothing else new). Rankguard's own rank
#: verdicts read none of them but ``since_progress_s`` (the progress age, anchored at
#: :meth:`RankVerdicts.ticked`) for a live rank in train past its first step.
CLOCK_FIELDS = (
    "seq",
    "wall_time_ns",
    "monotonic_ns",
    "since_progress_s",
    "last_progress_monotonic_ns",
    "phase_elapsed_s",
    "relayed_age_s",
)
# everything else of a record, gathered in one C call (a relayed rank's tick shares its
# base record's values: compared by identity first)
_JUDGED = attrgetter(*(f for f in HeartbeatRecord.__dataclass_fields__ if f not in CLOCK_FIELDS))
_ONLY_PROGRESS = frozenset({FindingType.PROGRESS_TIMEOUT})


class RankVerdicts:
    """A live rank's turn: the settling verdicts in order until one settles it, then
    the checks of a live rank. Its due time is the earliest of theirs."""

    __slots__ = ("_dues", "_limits", "checks", "own", "settle")

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
        # the cadence's timeouts :meth:`advanced` reads, worked out once per cadence (a
        # frozen one: a job's timeouts change only with a new cadence)
        self._limits: tuple[Cadence, float, float, float] | None = None

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
        cadence, limits = view.cadence, self._limits
        if limits is None or limits[0] is not cadence:
            limits = self._limits = (
                cadence,
                cadence.process_timeout_s,
                cadence.step_timeout_s,
                cadence.shortest_progress_timeout_s,
            )
        _, process_timeout, step_timeout, shortest = limits
        fresh_s = view.fresh_s
        hb_age = now - seen
        if hb_age > fresh_s or hb_age > process_timeout:
            return None
        # stall_age's, for a record in train past its first step and not saving
        stall = hb_age + since
        if s.train_since is not None:
            stall = min(stall, now - s.train_since)
        if s.resumed_at is not None:
            stall = min(stall, now - s.resumed_at)
        if stall > step_timeout:
            return None
        s.late = False
        s.liveness = Liveness.ALIVE
        s.progress = Progress.PROGRESSING
        s.stall = None
        if s.blocked_by:
            s.blocked_by = []
        s.culprits_gone_at = None
        due = min(seen + process_timeout, seen + fresh_s, seen - since + shortest)
        return due - 1e-6  # as :meth:`due`

    def ticked(
        self, view: JobView, s: RankState, rec: HeartbeatRecord, seen: float
    ) -> float | None:
        """A new record ``rec`` of live rank ``s`` (first seen at ``seen``) that moved
        only its clocks (:data:`CLOCK_FIELDS`): while its state is known and settled, as
        at each tick of a rank that waits in a collective hang, its turn would leave that
        state as it is and only move its due time. That due time, or None (the rank's
        turn decides; nothing is touched). Only with rankguard's own verdicts
        (:attr:`own`), for a rank judged since its latest record.

        Settled: alive and progressing in train past its first step, nothing active,
        blocked or late (what :meth:`advanced` leaves), due by its heartbeats turning
        late, its process timeout or the shortest progress timeout; or stalled in train
        past the step timeout already at ``seen`` (the stall's age only grows until a
        new record: :meth:`DueRanks.age_stalls` moves it on), at most its own
        ``gpu_progress_timeout`` active, due by its heartbeats. A scan after the due
        time judges the rank in full, so a turn that would have given another verdict
        (heartbeats late, progress past its timeout) is never skipped: the due time
        has come by then. No GPU health verdict (a new snapshot marks the rank due
        anyway), not saving, no event but a heartbeat, no pause on its own clock
        (which restarts the progress clock: the rank's turn)."""
        prev = s.record
        if (
            prev is None
            or rec.progress_seq != prev.progress_seq  # it stepped (most records): a turn
            or s.ages is None  # a record not judged yet: its turn comes
            or s.late
            or s.liveness is not Liveness.ALIVE
            or s.gpu_health
            or rec.event is not Event.HEARTBEAT
            or rec.checkpoint_active
            or rec.phase not in TRAIN_PHASES
            or rec.progress_seq <= 0
        ):
            return None
        since = rec.since_progress_s
        before, after = prev.monotonic_ns, rec.monotonic_ns
        if (
            since is None
            or (before is not None and after is not None and after - before > view.fresh_s * 1e9)
            or _JUDGED(rec) != _JUDGED(prev)
        ):
            return None
        cadence = view.cadence
        due = min(seen + view.fresh_s, seen + cadence.process_timeout_s)
        progress = s.progress
        if progress is Progress.PROGRESSING:
            if s.active or s.stall is not None or s.blocked_by or s.culprits_gone_at is not None:
                return None
            due = min(due, seen - since + cadence.shortest_progress_timeout_s)
        elif progress is Progress.STALLED:
            timeout = cadence.step_timeout_s
            stall = s.stall
            if (
                stall is None
                or stall[0] != timeout
                or not s.active <= _ONLY_PROGRESS
                or stall_age(s, rec, seen, since) <= timeout
            ):
                return None
        else:
            return None
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
