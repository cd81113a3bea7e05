"""A run directory's events as the goodput ledger's attempts.

Each attempt is one process of global rank 0 (its heartbeat file
``rank_0_pid_<p>.heartbeat.jsonl``): rank 0 starts with every attempt and its step clock
is the job's. From its records, each measured by the rank itself:

- start and end: the ``process_start`` record, the ``process_end`` record (else the last
  record: a process killed without one);
- completed steps: each record after a step gives its iteration and the time of the last
  step (``wall_time_ns`` less the monotonic time since ``last_progress_monotonic_ns``);
- phases: each record's phase began ``phase_elapsed_s`` before it (the heartbeat thread
  writes a record at each phase change); a phase lasts until the next one begins;
  (the first record at a step count: a later one at the same count may carry a later
  last progress that is no step, an in-process re-entry marking the rank recovered);
- the iteration it resumed after: the iteration of its first record whose
  ``iteration_source`` is ``checkpoint`` or that came before any step, else the first
  step record's iteration less the training steps it counts (``progress_seq`` less
  ``checkpoint_count``);
- rank 0's ``perf.jsonl`` windows, each written just after its last step (a heartbeat's
  time of the same iteration wins: it is the step's end): the window's own
  ``iteration`` when the script numbers its steps (``iteration_source`` ``script``), else
  the resumed iteration plus the window's ``step``; the first window
  (``includes_startup``) is the end of the attempt's first step.

Every other rank's last record (read from the end of its current heartbeat file; its
processes that ended within the attempt): the furthest step one of them completed past
rank 0's last record (a rank stopped by the agent while it waits in a collective on a
failed peer writes nothing after its last heartbeat; the failed rank's ``process_end``,
written on its way out before the agent can see it gone, has the step count every rank
completed in lock-step training), and the first exit on an error.

The launcher's ``restarts.jsonl`` gives the decision after each failed attempt (a
restart's line, or a ``stop`` line), and each live recovery (a ``live_recovery`` line:
a lost rank replaced by a standby process while the job went on, with ``fault_t``,
``resumed_t`` and ``steps_redone``; when the lost rank was rank 0, its standby's
heartbeat file continues the same attempt); ``findings.jsonl`` the first evidence of a
fault (a finding's detection time); node 0's ``launcher_node_0.json`` the launch
(``started_unix_s``), where the wall time starts, and, once the agent's run is over,
``ended_unix_s``: the job's end (the ranks' exit after their last record included).
Reads are bounded: at most ``MAX_LINES`` lines a file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rankguard.goodput.ledger import Attempt, Ledger, LiveRecovery, build_ledger
from rankguard.schema.coerce import as_finite, as_int
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import (
    FINDINGS_FILE,
    HEARTBEAT_FILE_RE,
    PERF_LOG_FILE,
    PERF_ROOT,
    RESTARTS_FILE,
    launcher_file_name,
)

__all__ = [
    "LIVE_RECOVERY",
    "MAX_LINES",
    "read_attempts",
    "read_launch",
    "read_launch_end",
    "read_ledger",
]

MAX_LINES = 2_000_000
LIVE_RECOVERY = "live_recovery"  # restarts.jsonl's kind of a live recovery's line
_MAX_LINE = 1 << 20
_TAIL_BYTES = (1 << 13, 1 << 16, _MAX_LINE + 1)  # a peer's last record: its file's end


def _lines(path: Path) -> Iterator[JsonObject]:
    """The JSON objects of a JSONL file (bad or overlong lines skipped)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below, also on a generator exit)
    except OSError:
        return
    with fh:
        for n, raw in enumerate(fh):
            if n >= MAX_LINES:
                return
            if len(raw) > _MAX_LINE:
                continue
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):  # a line nested past the parser
                continue
            if isinstance(obj, dict):
                yield obj


def iso_epoch_s(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 time with its offset, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


@dataclass
class _Process:
    pid: int
    start: float | None = None
    end: float | None = None
    last_seen: float = 0.0
    clean: bool | None = None  # process_end's clean (None: no process_end)
    # (pid, progress_seq) -> (iteration, time): by the step count, which only goes up (an
    # iteration repeats after a live recovery rolled back); the pid keeps a standby's
    # count apart from the lost process's it continues
    steps: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)
    resumed_from: int | None = None
    phase_starts: set[tuple[str, float]] = field(default_factory=set)
    # (time, iteration, training steps: progress_seq less the saves among it)
    first_seen: tuple[float, int, int] | None = None
    script_numbered: bool = False  # the script numbers its steps (iteration_source script)
    # in-process re-entries, by their phase's start: (the iteration then, the training
    # steps then, the iteration training resumed after: known once a later record counts
    # more steps, as that record's iteration less the steps made since)
    reentries: dict[float, tuple[int, int, int | None]] = field(default_factory=dict)
    _open: float | None = None  # the re-entry whose resumed iteration is not known yet

    def add(self, rec: JsonObject) -> None:
        wall_ns = as_finite(rec.get("wall_time_ns"))
        if wall_ns is None:
            return
        wall = wall_ns / 1e9
        self.last_seen = max(self.last_seen, wall)
        event = rec.get("event")
        if event == "process_start":
            self.start = wall if self.start is None else min(self.start, wall)
        elif event == "process_end":
            self.end = wall
            info = rec.get("exit")
            self.clean = bool(info.get("clean")) if isinstance(info, dict) else None
        iteration = rec.get("iteration")
        progress = rec.get("progress_seq")
        if not isinstance(iteration, int) or isinstance(iteration, bool):
            iteration = None
        restored = progress == 0 or rec.get("iteration_source") == "checkpoint"
        if iteration is not None and restored and self.resumed_from is None:
            self.resumed_from = iteration
        mono, last = (
            as_finite(rec.get("monotonic_ns")),
            as_finite(rec.get("last_progress_monotonic_ns")),
        )
        if rec.get("iteration_source") == "script":
            self.script_numbered = True
        if iteration is not None and isinstance(progress, int) and progress > 0 and mono and last:
            when = wall - max(0.0, mono - last) / 1e9
            # The first record at a count has that step's end: a later one at the same
            # count may have a later last progress that is no step (an in-process
            # re-entry marks the rank recovered without one).
            seen = self.steps.get((self.pid, progress))
            if seen is None or when < seen[1]:
                self.steps[(self.pid, progress)] = (iteration, when)
            if self.first_seen is None or when < self.first_seen[0]:
                self.first_seen = (when, iteration, _training_steps(rec, progress))
        phase, elapsed = rec.get("phase"), as_finite(rec.get("phase_elapsed_s"))
        if isinstance(phase, str) and elapsed is not None:
            self.phase_starts.add((phase, round(wall - elapsed, 3)))
            if iteration is not None and isinstance(progress, int) and progress >= 0:
                self._reentry(phase, round(wall - elapsed, 3), iteration, rec, progress)

    def _reentry(
        self, phase: str, began: float, iteration: int, rec: JsonObject, progress: int
    ) -> None:
        """An ``inprocess_restart`` phase opens a re-entry (the record at its start has
        the last completed step); the first later record with more steps closes it."""
        count = _training_steps(rec, progress)
        if phase == "inprocess_restart":
            if began not in self.reentries:
                self.reentries[began] = (iteration, count, None)
                self._open = began
            return
        if self._open is None:
            return
        it0, n0, _ = self.reentries[self._open]
        if count > n0:
            self.reentries[self._open] = (it0, n0, iteration - (count - n0))
            self._open = None

    @property
    def begin(self) -> float:
        return self.start if self.start is not None else self.last_seen

    @property
    def finish(self) -> float:
        return self.end if self.end is not None else self.last_seen

    def phases(self) -> list[tuple[str, float, float]]:
        starts = sorted((t, p) for p, t in self.phase_starts)
        out: list[tuple[str, float, float]] = []
        for i, (t, p) in enumerate(starts):
            if i and starts[i - 1][1] == p:
                continue  # the same phase seen again (records round differently)
            nxt = next((t2 for t2, p2 in starts[i + 1 :] if p2 != p), self.finish)
            out.append((p, t, nxt))
        return out


def _training_steps(rec: JsonObject, progress: int) -> int:
    """The record's training steps: its progress less the saves among it."""
    saves = as_int(rec.get("checkpoint_count")) or 0
    return progress - saves if 0 <= saves <= progress else progress


def _when(value: Any) -> float | None:
    """Epoch seconds of a number or of an ISO-8601 time with its offset."""
    return as_finite(value) if not isinstance(value, str) else iso_epoch_s(value)


@dataclass(frozen=True, slots=True)
class _LiveLine:
    recovery: LiveRecovery
    lost_pid: int | None
    standby_pid: int | None


def _live_lines(run_dir: Path) -> list[_LiveLine]:
    """The ``live_recovery`` lines of ``restarts.jsonl`` with a fault time, in order."""
    out = []
    for rec in _lines(run_dir / RESTARTS_FILE):
        fault = _when(rec.get("fault_t"))
        if rec.get("kind") != LIVE_RECOVERY or fault is None:
            continue
        resumed = _when(rec.get("resumed_t"))
        redone = as_int(rec.get("steps_redone"))
        cause = rec.get("cause")
        step = as_int(rec.get("resumed_step"))
        recovery = LiveRecovery(
            fault=fault,
            resumed=resumed if resumed is not None and resumed >= fault else None,
            steps_redone=max(0, redone or 0),
            cause=str(cause)[:200] if cause is not None else LIVE_RECOVERY,
            lost_rank=as_int(rec.get("lost_rank")),
            resumed_step=step if step is not None and step >= 1 else None,
        )
        out.append(_LiveLine(recovery, as_int(rec.get("lost_pid")), as_int(rec.get("standby_pid"))))
    return sorted(out, key=lambda x: x.recovery.fault)


def _merge(procs: list[_Process], live: list[_LiveLine]) -> list[_Process]:
    """A standby that took rank 0's place continues the lost process's attempt."""
    by_pid = {p.pid: p for p in procs}
    for line in live:
        lost = by_pid.get(line.lost_pid) if line.lost_pid is not None else None
        standby = by_pid.get(line.standby_pid) if line.standby_pid is not None else None
        if line.recovery.lost_rank != 0 or lost is None or standby is None or lost is standby:
            continue
        lost.steps.update(standby.steps)
        lost.phase_starts |= standby.phase_starts
        lost.last_seen = max(lost.last_seen, standby.last_seen)
        lost.end, lost.clean = standby.end, standby.clean
        lost.script_numbered = lost.script_numbered or standby.script_numbered
        lost.reentries.update(standby.reentries)
        if lost.first_seen is None:
            lost.first_seen = standby.first_seen
        by_pid[standby.pid] = lost
        procs = [p for p in procs if p is not standby]
    return procs


def _last_record(path: Path) -> JsonObject | None:
    """The last complete record of a JSONL file, read from its end (8 KiB, then more, up
    to the longest line read), or None: a line still being written has no newline yet."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError:
        return None
    with fh:
        try:
            size = fh.seek(0, os.SEEK_END)
            for window in _TAIL_BYTES:
                fh.seek(max(0, size - window))
                rec = _last_whole(fh.read(window), whole=size <= window)
                if rec is not None or size <= window:
                    return rec
        except OSError:
            return None
    return None


def _last_whole(tail: bytes, *, whole: bool) -> JsonObject | None:
    """The last record among the complete lines of ``tail`` (the file's end, or the
    whole file: else its first line is cut)."""
    lines = tail.split(b"\n")[:-1]  # after the last newline: nothing, or a torn line
    if not whole:
        lines = lines[1:]
    for raw in reversed(lines):
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and as_finite(obj.get("wall_time_ns")) is not None:
            return obj
    return None


def _peers(run_dir: Path) -> list[_Process]:
    """Each process of a rank other than 0 as its last record says (its ``process_end``
    when it wrote one): the steps it completed and how it ended."""
    out = []
    for path in run_dir.iterdir():
        m = HEARTBEAT_FILE_RE.match(path.name)
        if m is None or int(m.group(1)) == 0:
            continue
        rec = _last_record(path)
        if rec is None:
            continue
        proc = _Process(int(m.group(2)))
        proc.add(rec)
        out.append(proc)
    return out


def _reached_by_peers(
    ordered: list[tuple[float, int]], peers: list[_Process], begin: float
) -> list[tuple[float, int]]:
    """Rank 0's (time, iteration) steps, and after them the furthest step a peer of the
    attempt completed beyond rank 0's last record: in lock-step training every rank
    completes the steps its peers do (a step's collectives need them all), but a rank
    stopped by the agent (SIGTERM while it waits in a collective on the failed peer)
    writes nothing after its last heartbeat, while the failed rank's own exit record
    is written before the agent can see it gone, so before any peer is stopped."""
    last_t, last_it = ordered[-1] if ordered else (begin, None)
    best: tuple[int, float] | None = None
    for peer in peers:
        for it, t in peer.steps.values():
            # after rank 0's last step (not a count from before a live recovery's or an
            # in-process re-entry's return to an earlier iteration), and further
            if t > last_t and (last_it is None or it > last_it) and (best is None or it > best[0]):
                best = (it, t)
    return ordered if best is None else [*ordered, (best[1], best[0])]


def _first_error_exit(rank0: _Process, peers: list[_Process], last_t: float) -> float | None:
    """When the first rank of an attempt exited on an error: rank 0, or a peer after
    the attempt's last completed step (one before it was an earlier fault's)."""
    ends = [p.end for p in peers if p.clean is False and p.end is not None and p.end >= last_t]
    if rank0.clean is False and rank0.end:
        ends.append(rank0.end)
    return min(ends, default=None)


def _processes(run_dir: Path) -> list[_Process]:
    procs: dict[int, _Process] = {}
    # a rotated file (``.1``) before the one that followed it: records in time order
    paths = sorted(run_dir.iterdir(), key=lambda p: (p.name.removesuffix(".1"), p.suffix != ".1"))
    for path in paths:
        name = path.name.removesuffix(".1")
        m = HEARTBEAT_FILE_RE.match(name)
        if m is None or int(m.group(1)) != 0:
            continue
        pid = int(m.group(2))
        proc = procs.setdefault(pid, _Process(pid))
        for rec in _lines(path):
            proc.add(rec)
    return sorted((p for p in procs.values() if p.last_seen), key=lambda p: p.begin)


@dataclass(frozen=True, slots=True)
class _PerfWindow:
    step: int  # the attempt's training steps at the window's end
    iteration: int | None  # the rank's iteration there (the script's, when it numbers)
    when: float  # when the window was written, just after its last step
    startup: bool  # the window includes the start-up


def _perf_steps(run_dir: Path) -> list[_PerfWindow]:
    """Rank 0's perf windows."""
    perf = run_dir.parent.parent / PERF_ROOT / run_dir.name / PERF_LOG_FILE
    out = []
    for rec in _lines(perf):
        step, when = as_int(rec.get("step")), iso_epoch_s(rec.get("timestamp"))
        if step is not None and when is not None:
            startup = bool(rec.get("includes_startup"))
            out.append(_PerfWindow(step, as_int(rec.get("iteration")), when, startup))
    return out


def _times(path: Path, key: str, decoder: Any) -> list[tuple[float, JsonObject]]:
    out = []
    for rec in _lines(path):
        when = decoder(rec.get(key))
        if when is not None:
            out.append((when, rec))
    return sorted(out, key=lambda x: x[0])


def read_attempts(run_dir: str | os.PathLike[str]) -> list[Attempt]:
    """The attempts of the run in ``run_dir`` (empty: no heartbeat of rank 0)."""
    root = Path(os.path.abspath(run_dir))  # its parent's parent holds the perf log
    live = _live_lines(root)
    procs = _merge(_processes(root), live)
    peers = _peers(root)
    perf = _perf_steps(root)
    decisions = [
        (t, r)
        for t, r in _times(root / RESTARTS_FILE, "wall_time", iso_epoch_s)
        if r.get("kind") not in ("inprocess", LIVE_RECOVERY)
    ]
    findings = _times(root / FINDINGS_FILE, "detected_wall_time", iso_epoch_s)
    attempts = []
    for i, proc in enumerate(procs):
        nxt_begin = procs[i + 1].begin if i + 1 < len(procs) else math.inf
        resumed = proc.resumed_from
        if resumed is None and proc.first_seen is not None:
            _, it, seq = proc.first_seen
            resumed = it - seq if it - seq >= 0 else None
        steps = {it: t for it, t in proc.steps.values()}  # the newest time of each
        for w in perf:
            if not proc.begin <= w.when <= proc.finish + 1.0 or w.when >= nxt_begin:
                continue
            if proc.script_numbered and w.iteration is not None:
                it = w.iteration  # the script's own number, from its step clock
            elif resumed is not None:
                it = resumed + w.step
            elif w.startup:  # the first step, its iteration unknown: before every other
                it = min(steps, default=1)
            else:
                continue
            # a heartbeat's step time is the step's end; a window's, when it was written
            steps.setdefault(it, w.when)
        ordered = sorted({(t, it) for it, t in [*proc.steps.values(), *steps.items()]})
        # the peers that ended within this attempt (the agent stops every rank before
        # it starts the next one)
        ended = [p for p in peers if proc.begin <= p.last_seen < nxt_begin]
        ordered = _reached_by_peers(ordered, ended, proc.begin)
        last_t = ordered[-1][0] if ordered else proc.begin
        decision = next(((t, r) for t, r in decisions if last_t <= t < nxt_begin), None)
        fault = next((t for t, _ in findings if last_t <= t < nxt_begin), None)
        failed = (
            decision is not None or proc.clean is False or (proc.end is None and i + 1 < len(procs))
        )
        if decision is not None and fault is None:  # else the first exit on an error
            fault = _first_error_exit(proc, ended, last_t)
        attempts.append(
            Attempt(
                start=proc.begin,
                end=max(proc.finish, last_t),
                steps=[(it, t) for t, it in ordered],
                phases=proc.phases(),
                resumed_from=resumed,
                failed=failed,
                decision=decision[0] if decision is not None else None,
                fault=fault,
                cause=str(decision[1].get("cause")) if decision is not None else None,
                live=[
                    x.recovery
                    for x in live
                    if proc.begin <= x.recovery.fault < min(nxt_begin, proc.finish + 1.0)
                ],
                reentries=[(t, it, after) for t, (it, _, after) in proc.reentries.items()],
            )
        )
    return attempts


def _launcher_file(run_dir: str | os.PathLike[str]) -> JsonObject | None:
    """Node 0's launcher file, or None (none, too long, not JSON)."""
    path = Path(run_dir) / launcher_file_name(0)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_LINE + 1)
    except OSError:
        return None
    if len(raw) > _MAX_LINE:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def read_launch(run_dir: str | os.PathLike[str]) -> float | None:
    """When node 0's launcher started (its ``started_unix_s``), or None."""
    obj = _launcher_file(run_dir)
    return as_finite(obj.get("started_unix_s")) if obj is not None else None


def read_launch_end(run_dir: str | os.PathLike[str]) -> float | None:
    """When node 0's launcher saw its last workers end (its ``ended_unix_s``, written
    once the agent's run is over), or None (the launch goes on, or ended before it
    recorded it)."""
    obj = _launcher_file(run_dir)
    return as_finite(obj.get("ended_unix_s")) if obj is not None else None


def read_ledger(run_dir: str | os.PathLike[str]) -> Ledger | None:
    """The ledger of the run in ``run_dir``, from its launch; None when it has no
    heartbeat of rank 0."""
    attempts = read_attempts(run_dir)
    if not attempts:
        return None
    last = attempts[-1]  # a stop decided after the last rank's end ends the job
    end = max(last.end, last.decision or last.end)
    ended = read_launch_end(run_dir)
    if ended is not None and ended > last.start:  # not an earlier launch's end
        # the ranks' exit after their last record and the agent's seeing it: the job's
        end = max(end, ended)
    return build_ledger(attempts, end, launched=read_launch(run_dir))
