"""A live one-line job status on the launcher's terminal (demo and ``--live``).

On a terminal the line is redrawn in place; in a log (CI) a line is printed only when
the state or the counts change, at most every few seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any

from rankguard.monitor.api import FindingSink
from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import RestartEntry, RestartsBlock
from rankguard.schema.status import MonitorInfo, StatusDoc
from rankguard.schema.statusblocks import PreemptionBlock, StopRequestedBlock, stop_words
from rankguard.util.textsafe import safe_text
from rankguard.view.statusnotes import ITERATION_MARKS, restart_cause, restarts_summary

__all__ = [
    "LiveStatus",
    "live_recovery_line",
    "monitor_problem",
    "restart_line",
    "run_end_line",
    "status_line",
]


def status_line(status: JsonObject) -> str:
    """One line for the terminal; values from the ranks' records are shown with their
    control characters escaped."""
    return safe_text(_status_line(status))


def _status_line(status: JsonObject) -> str:
    if not status:
        return "waiting for the first scan"
    doc = StatusDoc.from_dict(status)
    ranks = doc.ranks
    iters = [r.iteration for r in ranks if r.iteration is not None]
    live = Counter(str(r.process_liveness) for r in ranks)
    prog = Counter(str(r.gpu_progress) for r in ranks)
    marks = {ITERATION_MARKS.get(str(r.iteration_source), "") for r in ranks}
    mark = marks.pop() if len(marks) == 1 else ""  # * steps counted, + checkpoint's step
    it = f"iter {min(iters)}-{max(iters)}{mark}" if iters else "iter -"
    live_s = " ".join(f"{k}={v}" for k, v in sorted(live.items()))
    prog_s = " ".join(f"{k}={v}" for k, v in sorted(prog.items()))
    total = doc.summary.findings_total
    line = f"[{doc.state}] {it} | {live_s} | {prog_s} | findings {total or 0}"
    restarts = doc.block(RestartsBlock)
    if restarts is not None and restarts.entries:
        line += f" | restarts {len(restarts.entries)}"
    return line + monitor_problem(doc.monitor)


def restart_line(entry: RestartEntry) -> str:
    """The console line of one restart of the worker group, with its cause."""
    number = entry.restart if "restart" in entry.keys else "?"
    return safe_text(f"restart {number} of the workers: {restart_cause(entry)}")


def live_recovery_line(entry: RestartEntry) -> str:
    """The console line of a live recovery (a ``restarts.jsonl`` line of kind
    ``live_recovery``): the rank, its standby (or the shrink), the cause, the cost and
    where the newcomer's state came from; the source, said by the ranks through the
    store, is shown with its control characters escaped."""
    recovery_s = entry.number("recovery_s")
    cost = (
        f"fault -> next step {recovery_s:.2f} s, {entry.number('steps_redone')} step(s) redone"
        if recovery_s is not None
        else "its next step was not seen"
    )
    standby = entry.number("standby_pid")
    now = (  # a shrink (no standby left): the job went on without the rank
        f"now standby pid {standby}"
        if standby is not None
        else f"dropped, the job goes on with {entry.number('world_size')} rank(s)"
    )
    source = entry.extra.get("source")
    state = f"; state from {source}" if isinstance(source, str) and source else ""
    return safe_text(
        f"live recovery {entry.restart}: rank {entry.number('lost_rank')} {now} "
        f"({entry.cause}); {cost}{state}"
    )


def run_end_line(status: JsonObject | None) -> str:
    """The launcher's last word on the run: the job's state (``stopped``: the launcher
    stopped the workers on a signal; the monitor thread's own state, ``monitor.state``,
    is said apart when it is not ``scanning``), its findings and every restart with its
    cause."""
    doc = StatusDoc.from_dict(status or {})
    total = doc.summary.findings_total or 0
    state = doc.state or "unknown"
    if state == "stopped":
        state = _stopped_how(doc)
    line = f"run {state}: {total} finding(s)"
    block = doc.block(RestartsBlock)
    restarts = restarts_summary(block.entries) if block is not None else None
    if restarts:
        line += f", {restarts}"
    return safe_text(line + monitor_problem(doc.monitor))


def _stopped_how(doc: StatusDoc) -> str:
    """Who stopped a ``stopped`` job: the preemption, the stop step node 0 agreed on
    for a straggler (``stop_if_detected``), else the launcher (a signal)."""
    pre = doc.block(PreemptionBlock)
    if pre is not None and pre.reason:
        return "stopped: preempted"
    stop = doc.block(StopRequestedBlock)
    if stop is not None and str(stop.reason or "").startswith("straggler"):
        return f"stopped: straggler (every rank asked to stop {_stop_words(stop)})"
    return "stopped by the launcher"


def _stop_words(stop: StopRequestedBlock) -> str:
    if stop.stop_at_step is None:
        return "at a step not known"
    return stop_words(stop.stop_at_step, stop.stop_at_script_step)


def monitor_problem(monitor: MonitorInfo) -> str:
    """`` | MONITOR FAILING ...`` when the monitor's scans fail or its thread stopped
    (``monitor.state`` in status.json); empty otherwise."""
    if monitor.state in (None, "scanning"):
        return ""
    return (
        f" | MONITOR {monitor.state.upper()} ({monitor.errors} failed "
        f"scan(s); last: {monitor.last_error})"
    )


class LiveStatus(FindingSink):
    """The console sink: one line per finding, and the live status line."""

    def __init__(self, monitor: JobMonitor, interval_s: float = 1.0, stream: Any = None) -> None:
        self.monitor = monitor
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = ""
        self._last_print = 0.0
        self._seen_findings = 0

    def start(self) -> None:
        self.monitor.add_sink(self)
        self._thread = threading.Thread(target=self._loop, name="rankguard-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()

    def after_write(self, finding: Finding) -> None:
        prefix = "\r\033[K" if self.tty else ""
        self.stream.write(
            f"{prefix}[rankguard] FINDING {finding.finding_type.value}: "
            f"{safe_text(finding.message)}\n"
        )
        self.stream.flush()
        self._last = ""

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            line = status_line(self.monitor.status)
            now = time.monotonic()
            if self.tty:
                self.stream.write(f"\r\033[K[rankguard] {line}")
                self.stream.flush()
                self._last = line
            elif line != self._last and now - self._last_print >= 5.0:
                self.stream.write(f"[rankguard] {line}\n")
                self.stream.flush()
                self._last, self._last_print = line, now
