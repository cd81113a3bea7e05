"""The goodput ledger: every second of a job's wall time in one part (pure).

The input is one :class:`Attempt` per start of the worker group, with the times the run
measured where they happened (:mod:`rankguard.goodput.rundir` reads them from the run
directory). The job's wall time, from its launch (else the first attempt's start) to
the last attempt's end, is cut into consecutive spans, so the parts sum to the wall
time by construction:

| span | part |
|---|---|
| the launch -> the first attempt's start | ``startup`` (launcher, rendezvous, imports) |
| attempt start -> end of its first step | ``startup`` (imports, state load, first step) |
| first step -> last completed step | ``productive``, less the phases below and the lost work |
| a ``checkpointing`` phase within it | ``checkpoint_stall`` |
| an ``eval`` phase | ``evaluation`` |
| a ``rerun*`` phase | ``rerun_validation`` |
| a ``preempt*`` phase | ``preemption_drain`` |
| an ``inprocess_restart`` phase | ``recovery`` (the ranks re-entered in-process) |
| a re-entry: last step before its phase -> the phase | ``detection_wait`` |
| a re-entry: the steps after the iteration it resumed from | ``recomputed`` |
| steps after the iteration the next restoring attempt resumed from | ``recomputed`` (redone) |
| last completed step -> the restart or stop decision | ``detection_wait`` |
| decision -> the next attempt's start | ``recovery`` (stop, rendezvous, process start) |
| a live recovery: last step before its fault -> the fault | ``detection_wait`` |
| a live recovery: fault -> training resumed | ``recovery`` (a standby took the lost rank's place) |
| a live recovery: the ``steps_redone`` steps before its fault | ``recomputed`` |
| a failed last attempt: last step -> its end | ``detection_wait`` |
| a completed last attempt: last step -> its end | ``unknown`` (closing) |
| anything else (a gap no event explains) | ``unknown`` |

ETTR (effective training time ratio) is ``productive / wall``. An in-process re-entry
(rank 0's ``inprocess_restart`` phase) that is no part of a live recovery is an
interruption of its own (kind ``inprocess``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "PARTS",
    "Attempt",
    "Interruption",
    "Ledger",
    "LiveRecovery",
    "Part",
    "build_ledger",
    "ettr_text",
    "phase_part",
]


class Part(str, Enum):
    PRODUCTIVE = "productive"
    STARTUP = "startup"
    RECOMPUTED = "recomputed"
    CHECKPOINT_STALL = "checkpoint_stall"
    EVALUATION = "evaluation"
    DETECTION_WAIT = "detection_wait"
    RECOVERY = "recovery"
    RERUN_VALIDATION = "rerun_validation"
    PREEMPTION_DRAIN = "preemption_drain"
    UNKNOWN = "unknown"


PARTS = tuple(Part)
ETTR_DIGITS = 3  # the ETTR as status.json, goodput.json and the perf summary keep it (0.1 %)


def ettr_text(ettr: float | None) -> str:
    """The ETTR as a percentage, from its kept digits: every place says the same."""
    return "-" if ettr is None else f"{100 * round(ettr, ETTR_DIGITS):.1f} %"


def phase_part(phase: str) -> Part | None:
    """The part a phase's time belongs to while training (None: training itself)."""
    if phase == "checkpointing":
        return Part.CHECKPOINT_STALL
    if phase == "eval":
        return Part.EVALUATION
    if phase.startswith("rerun"):
        return Part.RERUN_VALIDATION
    if phase.startswith("preempt"):
        return Part.PREEMPTION_DRAIN
    if phase == "inprocess_restart":
        return Part.RECOVERY
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRecovery:
    """A lost rank replaced while the job went on (no restart of the worker group):
    ``fault`` when the loss was seen, ``resumed`` when training went on (None: not
    said), ``steps_redone`` the steps before the fault that were done again,
    ``resumed_step`` the first step every rank ran after it (None: not said)."""

    fault: float
    resumed: float | None = None
    steps_redone: int = 0
    cause: str | None = None
    lost_rank: int | None = None
    resumed_step: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One start of the worker group; times in seconds since the epoch.

    ``steps``: (iteration, end time) of completed steps, sorted by time (every step, or
    samples of them); ``phases``: (phase, start, end) intervals; ``resumed_from``: the
    iteration this attempt's training resumed after (its checkpoint), None if unknown;
    ``decision``: when the launcher decided to restart or stop after this attempt
    failed; ``failed``: the attempt ended in a failure."""

    start: float
    end: float
    steps: Sequence[tuple[int, float]] = ()
    phases: Sequence[tuple[str, float, float]] = ()
    resumed_from: int | None = None
    failed: bool = False
    decision: float | None = None
    fault: float | None = None  # the first evidence of the fault (a finding, an error exit)
    cause: str | None = None
    live: Sequence[LiveRecovery] = ()  # live recoveries within it, by fault time
    # in-process re-entries, as rank 0's step clock saw them: (its ``inprocess_restart``
    # phase's start, the iteration then, the iteration training resumed after or None)
    reentries: Sequence[tuple[float, int, int | None]] = ()

    @property
    def first_step(self) -> float | None:
        return self.steps[0][1] if self.steps else None

    @property
    def last_step(self) -> tuple[int, float] | None:
        return self.steps[-1] if self.steps else None


@dataclass(slots=True)
class Interruption:
    """What one failure cost: lost work, detection, recovery and the next start-up."""

    attempt: int
    cause: str | None
    at: float  # the last completed step before it (or the attempt's start)
    iteration: int | None
    resumed_from: int | None
    first_evidence_s: float | None  # after the last completed step
    parts: dict[Part, float] = field(default_factory=dict)
    # restart (the worker group started again), live_recovery, inprocess (every rank
    # re-entered its training function in the same processes)
    kind: str = "restart"

    @property
    def cost_s(self) -> float:
        return sum(self.parts.values())

    def to_dict(self) -> JsonObject:
        return {
            "attempt": self.attempt,
            "kind": self.kind,
            "cause": self.cause,
            "at_unix_s": round(self.at, 3),
            "iteration": self.iteration,
            "resumed_from": self.resumed_from,
            "first_evidence_s": None
            if self.first_evidence_s is None
            else round(self.first_evidence_s, 3),
            "cost_s": round(self.cost_s, 3),
            "parts": {p.value: round(v, 3) for p, v in self.parts.items() if v > 0},
        }


@dataclass(slots=True)
class Ledger:
    start: float
    end: float
    parts: dict[Part, float]
    attempts: int
    interruptions: list[Interruption]
    #: the wall time as consecutive (start, end, part) spans, in order (the timeline)
    spans: list[tuple[float, float, Part]] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive / wall (None for no wall time)."""
        return self.parts[Part.PRODUCTIVE] / self.wall_s if self.wall_s > 0 else None

    def to_dict(self) -> JsonObject:
        return {
            "schema_version": 1,
            "start_unix_s": round(self.start, 3),
            "end_unix_s": round(self.end, 3),
            "wall_s": round(self.wall_s, 3),
            "ettr": None if self.ettr is None else round(self.ettr, ETTR_DIGITS),
            "attempts": self.attempts,
            "parts_s": {p.value: round(self.parts[p], 3) for p in PARTS},
            "interruptions": [i.to_dict() for i in self.interruptions],
        }


class _Tally:
    """Spans laid end to end from ``start``: each new span starts where the last ended
    (a span that would go back in time is empty), so the parts sum to the wall time."""

    def __init__(self, start: float) -> None:
        self.cursor = start
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.spans: list[tuple[float, float, Part]] = []
        self.owned: list[tuple[float, float]] = []  # spans already an interruption's cost

    def to(self, when: float | None, part: Part, into: dict[Part, float] | None = None) -> None:
        if when is None or when <= self.cursor:
            return
        self.add(part, when - self.cursor, into)
        if into is not None:
            self.owned.append((self.cursor, when))
        if self.spans and self.spans[-1][2] is part and self.spans[-1][1] == self.cursor:
            self.spans[-1] = (self.spans[-1][0], when, part)
        else:
            self.spans.append((self.cursor, when, part))
        self.cursor = when

    def add(self, part: Part, seconds: float, into: dict[Part, float] | None = None) -> None:
        self.parts[part] += seconds
        if into is not None:
            into[part] = into.get(part, 0.0) + seconds


def _clip(
    intervals: Iterable[tuple[float, float, Part]], lo: float, hi: float
) -> list[tuple[float, float, Part]]:
    """Intervals cut to [lo, hi], sorted, overlaps given to the earlier one."""
    out: list[tuple[float, float, Part]] = []
    for a, b, part in sorted((max(a, lo), min(b, hi), p) for a, b, p in intervals):
        if out and a < out[-1][1]:
            a = out[-1][1]
        if b > a:
            out.append((a, b, part))
    return out


def _reached(steps: Sequence[tuple[int, float]], iteration: int) -> float | None:
    """When ``steps`` reached ``iteration`` (its latest sample at or before it)."""
    when = None
    for it, t in steps:
        if it <= iteration:
            when = t if when is None else max(when, t)
    return when


def _resumed_after(later: Sequence[Attempt]) -> int | None:
    """The iteration training resumed after, following an attempt: that of the first
    later attempt that restored one. An attempt that failed in its start-up, with no
    step and no restored iteration, resumed nothing (the one after it still redoes the
    steps after its checkpoint); None when the first attempt that made steps does not
    say."""
    for attempt in later:
        if attempt.resumed_from is not None:
            return attempt.resumed_from
        if attempt.steps:
            return None
    return None


def _in_live(attempt: Attempt, a: float, b: float) -> bool:
    """Is the re-entry [a, b] part of a live recovery (the survivors re-enter then)? A
    recovery that gives no resumed time lasts to the next step after its fault."""

    def resumed(live: LiveRecovery) -> float:
        if live.resumed is not None:
            return live.resumed
        return next((t for _, t in attempt.steps if t > live.fault), b)

    return any(a <= resumed(live) and b >= live.fault for live in attempt.live)


def _reentry_spans(attempt: Attempt, a: float) -> list[tuple[float, float, Part]]:
    """What came before an in-process re-entry that began at ``a``: the last completed
    step -> ``a`` is detection wait (a peer's collective waiting on a failed or stuck
    rank, until the rank's own failure); the steps after the iteration it resumed from,
    done again (:attr:`Attempt.reentries`), recomputed."""
    before = [s for s in attempt.steps if s[1] <= a]
    if not before:
        return []
    it, at = before[-1]
    spans = [(at, a, Part.DETECTION_WAIT)]
    it, after = next(((i, x) for start, i, x in attempt.reentries if start == a), (it, None))
    if after is not None and after < it:
        since = _reached(before, after)
        if since is not None and since < at:
            spans.append((since, at, Part.RECOMPUTED))
    return spans


def _phase_spans(attempt: Attempt) -> list[tuple[float, float, Part]]:
    """The attempt's phases in their parts, each in-process re-entry that is no part of
    a live recovery with what came before it (:func:`_reentry_spans`)."""
    spans = []
    for name, a, b in attempt.phases:
        part = phase_part(name)
        if part is None:
            continue
        spans.append((a, b, part))
        if name == "inprocess_restart" and b > a and not _in_live(attempt, a, b):
            spans += _reentry_spans(attempt, a)
    return spans


def _training(
    tally: _Tally,
    attempt: Attempt,
    lo: float,
    hi: float,
    lost_from: float | None,
    into: dict[Part, float] | None,
) -> None:
    """[lo, hi] of training: phases in their parts, lost work after ``lost_from``,
    the rest productive."""
    for a, b, part in _clip(_phase_spans(attempt), lo, hi):
        _productive(tally, a, lost_from, into)
        tally.to(b, part)  # a save or an eval is no cost of the interruption
    _productive(tally, hi, lost_from, into)


def _productive(
    tally: _Tally, until: float, lost_from: float | None, into: dict[Part, float] | None
) -> None:
    if lost_from is not None and lost_from < until:
        tally.to(lost_from, Part.PRODUCTIVE)
        tally.to(until, Part.RECOMPUTED, into)
    else:
        tally.to(until, Part.PRODUCTIVE)


def _live(
    tally: _Tally,
    index: int,
    attempt: Attempt,
    live: LiveRecovery,
    limit: float,
    lost_from: float | None,
    into: dict[Part, float] | None,
) -> Interruption:
    """Training up to the last step before a live recovery's fault, then its parts:
    the ``steps_redone`` steps before it recomputed, last step -> fault detection
    wait, fault -> resumed recovery (to the next step when it does not say).

    The iterations come from the recovery itself when it names the step every rank ran
    next (``resumed_step``: training resumed after the one before it, and the fault
    came ``steps_redone`` steps later); else from the last step sampled before it."""
    before = [s for s in attempt.steps if s[1] <= live.fault]
    redone = max(0, live.steps_redone)
    it: int | None
    if live.resumed_step is not None:
        resumed_from: int | None = live.resumed_step - 1
        it = live.resumed_step - 1 + redone
        reached = _reached(before, it)
        at = reached if reached is not None else tally.cursor
    else:
        it, at = before[-1] if before else (None, tally.cursor)
        resumed_from = None if it is None else it - redone
    redone_from = None
    if it is not None and redone > 0 and before:
        redone_from = _reached(before, it - redone) or before[0][1]
    cut = Interruption(
        attempt=index,
        cause=live.cause,
        at=at,
        iteration=it,
        resumed_from=resumed_from,
        first_evidence_s=max(0.0, live.fault - at),
        kind="live_recovery",
    )
    if redone_from is not None and (lost_from is None or redone_from < lost_from):
        _training(tally, attempt, tally.cursor, min(at, limit), redone_from, cut.parts)
    else:  # lost anyway: the next attempt resumed from before them
        _training(tally, attempt, tally.cursor, min(at, limit), lost_from, into)
    tally.to(min(live.fault, limit), Part.DETECTION_WAIT, cut.parts)
    resumed = live.resumed
    if resumed is None:
        resumed = next((t for _, t in attempt.steps if t > live.fault), limit)
    tally.to(min(resumed, limit), Part.RECOVERY, cut.parts)
    return cut


def build_ledger(
    attempts: Sequence[Attempt], end: float | None = None, *, launched: float | None = None
) -> Ledger:
    """The ledger of a job made of ``attempts`` (in order), ending at ``end`` (default:
    the last attempt's end). ``launched``: when the job was launched, before the first
    attempt's start (that span is start-up: the launcher's own start, the rendezvous,
    the first ranks' interpreter and imports); None or a later time: the first
    attempt's start."""
    if not attempts:
        raise ValueError("attempts: a job has at least one attempt")
    start = attempts[0].start
    if launched is not None and launched < start:
        start = launched
    stop = max(end if end is not None else attempts[-1].end, start)
    tally = _Tally(start)
    tally.to(min(attempts[0].start, stop), Part.STARTUP)
    interruptions: list[Interruption] = []
    pending: Interruption | None = None  # the last failure: its next start-up is its cost
    for i, attempt in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        limit = min(nxt.start, stop) if nxt is not None else stop
        cost = pending.parts if pending is not None else None
        tally.to(
            min(attempt.start, limit), Part.UNKNOWN if pending is None else Part.RECOVERY, cost
        )
        first = attempt.first_step
        failed = attempt.failed or nxt is not None
        # no step: start-up until the attempt ended (failed) or the job did
        started = first if first is not None else attempt.end if failed else limit
        tally.to(min(started, limit), Part.STARTUP, cost)
        pending = None
        last = attempt.last_step
        interruption = None
        if failed:
            interruption = Interruption(
                attempt=i,
                cause=attempt.cause,
                at=last[1] if last is not None else attempt.start,
                iteration=last[0] if last is not None else None,
                resumed_from=nxt.resumed_from if nxt is not None else None,
                first_evidence_s=None
                if attempt.fault is None
                else max(0.0, attempt.fault - (last[1] if last else attempt.start)),
            )
            interruptions.append(interruption)
        into = interruption.parts if interruption is not None else None
        if last is not None and first is not None:
            lost_from = None
            resumed = _resumed_after(attempts[i + 1 :])
            if resumed is not None and resumed < last[0]:
                lost_from = _reached(attempt.steps, resumed) or first
            for live in sorted(attempt.live, key=lambda r: r.fault):
                if first <= live.fault < limit:
                    cut = _live(tally, i, attempt, live, limit, lost_from, into)
                    interruptions.insert(len(interruptions) - (interruption is not None), cut)
            _training(tally, attempt, tally.cursor, min(last[1], limit), lost_from, into)
        if failed:
            tally.to(min(attempt.decision or limit, limit), Part.DETECTION_WAIT, into)
            if nxt is not None:
                pending = interruption
                tally.to(limit, Part.RECOVERY, into)
            else:
                tally.to(limit, Part.DETECTION_WAIT, into)
        else:
            tally.to(limit, Part.UNKNOWN)
    tally.to(stop, Part.UNKNOWN)
    interruptions += _reentries(attempts, tally.spans, tally.owned)
    # in time order; at one time, what ended the attempt last
    interruptions.sort(key=lambda cut: (cut.attempt, cut.at, cut.kind == "restart"))
    return Ledger(
        start=start,
        end=stop,
        parts=tally.parts,
        attempts=len(attempts),
        interruptions=interruptions,
        spans=tally.spans,
    )


def _reentries(
    attempts: Sequence[Attempt],
    spans: Sequence[tuple[float, float, Part]],
    owned: Sequence[tuple[float, float]] = (),
) -> list[Interruption]:
    """Each in-process re-entry of rank 0 (an ``inprocess_restart`` phase) that is no
    part of a live recovery (the survivors re-enter then too: the recovery says it):
    at the iteration it began at, resumed after the one its step clock went on from
    (:attr:`Attempt.reentries`; else the steps sampled around it), its cost the
    recovery the ledger counted within it, less what is already another interruption's
    cost (``owned``: a re-entry within the detection wait of a fault that ended in a
    restart or a live recovery costs nothing more: each second is one interruption's)."""
    out = []
    for index, attempt in enumerate(attempts):
        seen = {start: (it, after) for start, it, after in attempt.reentries}
        for name, a, b in attempt.phases:
            if name != "inprocess_restart" or b <= a:
                continue
            if _in_live(attempt, a, b):
                continue
            before = [s for s in attempt.steps if s[1] <= a]
            after = [s for s in attempt.steps if s[1] > b]
            it, at = before[-1] if before else (None, a)
            resumed = after[0][0] - 1 if after else None
            if a in seen:  # the rank's own count: exact, however sparse the samples
                it, resumed = seen[a]
                at = _reached(before, it) or at
            # its cost: what the ledger laid from its first lost step to its phase's end
            since = min((x for x, _, _ in _reentry_spans(attempt, a)), default=a)
            parts: dict[Part, float] = {}
            for x, y, part in spans:
                lo, hi = max(since, x), min(b, y)
                if part in _REENTRY_PARTS and hi > lo:
                    free = hi - lo - sum(max(0.0, min(hi, v) - max(lo, u)) for u, v in owned)
                    if free > 0:
                        parts[part] = parts.get(part, 0.0) + free
            out.append(
                Interruption(
                    attempt=index,
                    cause="in-process re-entry",
                    at=at,
                    iteration=it,
                    resumed_from=resumed,
                    first_evidence_s=max(0.0, a - at) if before else None,
                    parts=parts,
                    kind="inprocess",
                )
            )
    return out


_REENTRY_PARTS = (Part.RECOMPUTED, Part.DETECTION_WAIT, Part.RECOVERY)
