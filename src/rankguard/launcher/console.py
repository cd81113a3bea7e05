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

from rankguard.heartbeat.api import FindingSink
from rankguard.heartbeat.monitor import JobMonitor
from rankguard.heartbeat.rules import peer_failure
from rankguard.schema.findings import Finding, FindingType
from rankguard.statusnotes import ITERATION_MARKS, restart_cause, restarts_summary
from rankguard.textsafe import safe_text

__all__ = [
    "LiveStatus",
    "failure_summary",
    "monitor_problem",
    "restart_line",
    "root_cause_lines",
    "run_end_line",
    "status_line",
]


def status_line(status: dict[str, Any]) -> str:
    """One line for the terminal; values from the ranks' records are shown with their
    control characters escaped."""
    return safe_text(_status_line(status))


def _status_line(status: dict[str, Any]) -> str:
    if not status:
        return "waiting for the first scan"
    ranks = status.get("ranks") or []
    iters = [r.get("iteration") for r in ranks if r.get("iteration") is not None]
    live = Counter(r.get("process_liveness") for r in ranks)
    prog = Counter(r.get("gpu_progress") for r in ranks)
    summary = status.get("summary") or {}
    marks = {ITERATION_MARKS.get(str(r.get("iteration_source")), "") for r in ranks}
    mark = marks.pop() if len(marks) == 1 else ""  # * steps counted, + checkpoint's step
    it = f"iter {min(iters)}-{max(iters)}{mark}" if iters else "iter -"
    live_s = " ".join(f"{k}={v}" for k, v in sorted(live.items()))
    prog_s = " ".join(f"{k}={v}" for k, v in sorted(prog.items()))
    line = (
        f"[{status.get('state')}] {it} | {live_s} | {prog_s} | "
        f"findings {summary.get('findings_total', 0)}"
    )
    restarts = status.get("restarts")
    if isinstance(restarts, list) and restarts:
        line += f" | restarts {len(restarts)}"
    return line + monitor_problem(status)


def restart_line(entry: dict[str, Any]) -> str:
    """The console line of one restart of the worker group, with its cause."""
    return safe_text(f"restart {entry.get('restart', '?')} of the workers: {restart_cause(entry)}")


def run_end_line(status: dict[str, Any] | None) -> str:
    """The launcher's last word on the run: the job's state (``stopped``: the launcher
    stopped the workers on a signal; the monitor thread's own state, ``monitor.state``,
    is said apart when it is not ``scanning``), its findings and every restart with its
    cause."""
    status = status or {}
    summary = status.get("summary")
    total = summary.get("findings_total", 0) if isinstance(summary, dict) else 0
    state = status.get("state") or "unknown"
    if state == "stopped":
        state = "stopped by the launcher"
    line = f"run {state}: {total} finding(s)"
    restarts = restarts_summary(status.get("restarts"))
    if restarts:
        line += f", {restarts}"
    return safe_text(line + monitor_problem(status))


def failure_summary(name: str, failures: dict[int, Any]) -> str | None:
    """What torchrun prints when the worker group failed: torch elastic's own
    ``ChildFailedError`` block (time, host, rank, local rank, exit code, error file and
    the traceback from it) for ``failures`` (a ``RunResult``'s), the first line as the
    exception's name prints it; None without failures."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not failures:
        return None
    error = ChildFailedError(name=name, failures=failures)
    return safe_text(
        f"{type(error).__module__}.{type(error).__name__}: \n{error}", keep_newlines=True
    )


def _agent_words(root: dict[str, Any]) -> str:
    sig = f" ({root['signal']})" if root.get("signal") else ""
    last = (str(root.get("error") or "-").strip().splitlines() or ["-"])[-1][:300]
    return (
        f"rank {root['rank']} (pid {root['pid']}) exited with code {root['exit_code']}{sig}: {last}"
    )


def _first_cause(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first finding of an error (not a warning) that names a rank: the failure the
    monitor saw first, on any node."""
    for f in findings:
        ftype = FindingType.parse(f.get("finding_type"))
        if (
            ftype is not None
            and ftype.info.severity == "error"
            and ftype is not FindingType.WORKER_FAILED
            and isinstance(f.get("rank"), int)
        ):
            return f
    return None


def _echo_only(f: dict[str, Any]) -> bool:
    """A rank's exit whose error says a peer went away, with no peer seen leaving."""
    exit_info = f.get("exit") or {}
    return (
        f.get("finding_type") == FindingType.PROCESS_EXITED.value
        and peer_failure(exit_info.get("error"))
        and not exit_info.get("peers_ended_first")
    )


def _finding_words(f: dict[str, Any]) -> str:
    early = (f.get("exit") or {}).get("peers_ended_first")
    if early and f.get("finding_type") == FindingType.PROCESS_EXITED.value:
        ranks = f"rank {early[0]}" if len(early) == 1 else f"ranks {', '.join(map(str, early))}"
        return (
            f"{ranks} left the job early (exited cleanly while rank {f['rank']} still ran "
            f"collectives with it); rank {f['rank']} then failed: {_last_error_line(f)}"
        )
    message = str(f.get("message") or "")
    who = f"rank {f['rank']} (pid {f.get('pid')} on {f.get('hostname')})"
    if message.startswith(who + ": "):
        return f"{who}: {f.get('finding_type')}: {message[len(who) + 2 :]}"
    return f"rank {f['rank']}: {f.get('finding_type')}: {message}"


def _last_error_line(f: dict[str, Any]) -> str:
    error = str((f.get("exit") or {}).get("error") or "-").strip()
    return (error.splitlines() or ["-"])[-1][:300]


def root_cause_lines(
    root: dict[str, Any] | None,
    acted: dict[str, Any] | None,
    findings: list[dict[str, Any]],
    *,
    monitored: bool = True,
    stopped: str | None = None,
    killed_on_request: bool = False,
) -> list[str]:
    """The launcher's verdict on a failed run, agreeing with the findings.

    ``root``: this node's agent's first failure (exit codes, error files); ``acted``: a
    finding the launcher acted on (fault tolerance killed its rank: that kill's exit
    code is rankguard's doing, the finding is the cause); ``findings``: the monitor's
    (node 0: every node's ranks), in the order found; ``monitored``: this node runs
    the monitor (else the findings are on node 0); ``stopped``: why a launcher stopped
    its ranks, as the monitor heard it (another node's SIGTERM); ``killed_on_request``:
    ``root``'s rank was killed by this node's relay for node 0's fault tolerance (the
    finding is on node 0). The root cause is the finding
    acted on, else the failure the monitor saw first when the agent's first failure is
    another rank or a peer's echo ("Connection closed by peer"), else the agent's
    first failure; a second line says why another rank's exit is not the cause."""
    if acted is not None and acted.get("finding_type") != FindingType.WORKER_FAILED.value:
        lines = [f"root cause: {_finding_words(acted)}"]
        if root is not None and root.get("rank") == acted.get("rank") and root.get("signal"):
            lines.append(
                f"  rank {root['rank']}'s exit code {root['exit_code']} ({root['signal']}) "
                "is fault tolerance's kill for that finding, not the cause"
            )
        elif root is not None:
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if root is not None and killed_on_request and not monitored:
        return [
            f"root cause: a finding on node 0 (its findings name it): {_agent_words(root)}: "
            "fault tolerance killed it on node 0's request (that kill's exit code, not the "
            "cause)"
        ]
    first = _first_cause(findings)
    if first is None and stopped is not None:
        lines = [f"root cause: no rank failed: the job was stopped ({stopped})"]
        if root is not None:
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if root is None:
        return [f"root cause: {_finding_words(first)}"] if first is not None else []
    echo = peer_failure(root.get("error"))
    if first is not None and _echo_only(first):
        first = None  # the monitor saw only the echo too: no cause found
    if first is not None and (first.get("rank") != root.get("rank") or echo):
        lines = [f"root cause: {_finding_words(first)}"]
        if first.get("rank") != root.get("rank"):
            lines.append(f"  this node's first failed worker, a consequence: {_agent_words(root)}")
        return lines
    if echo and monitored:  # the monitor saw no rank fail before it
        return [
            f"root cause: not found: {_agent_words(root)}: its peer went away, and no "
            "rank was seen failing before it"
        ]
    if echo:
        return [
            f"root cause: not on this node: {_agent_words(root)}: its peer went away; "
            "node 0's findings name the rank that failed first"
        ]
    return [f"root cause: {_agent_words(root)}"]


def monitor_problem(status: dict[str, Any]) -> str:
    """`` | MONITOR FAILING ...`` when the monitor's scans fail or its thread stopped
    (``monitor.state`` in status.json); empty otherwise."""
    monitor = status.get("monitor")
    if not isinstance(monitor, dict) or monitor.get("state") in (None, "scanning"):
        return ""
    return (
        f" | MONITOR {str(monitor.get('state')).upper()} ({monitor.get('errors')} failed "
        f"scan(s); last: {monitor.get('last_error')})"
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
