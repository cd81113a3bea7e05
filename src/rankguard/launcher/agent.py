"""``RankguardAgent``: torch elastic's ``LocalElasticAgent``, extended through the
worker-lifecycle methods ``SimpleElasticAgent`` is designed to have subclassed.

- ``_start_workers``: chain our handler in front of the termination handler torch
  elastic installs when it starts the workers, so the monitor learns that the launcher
  is stopping the job (SIGTERM/SIGINT/...) before the workers die; torch's handler still
  runs and still shuts them down. With ``--preload`` the start waits for the fork
  server's imports: :class:`~rankguard.launcher.forkwait.ForkWait` tells the monitor
  (the initial timeout counts from the fork) and says a fork server still importing.
- ``_monitor_workers``: remember the first failure of a failed group (rank, exit code,
  the traceback from the worker's error file written by ``@record``): the root cause.
- ``_monitor_workers`` with standbys (``--standby-ranks``): the node's workers are
  watched by :class:`~rankguard.launcher.live.LiveRecovery` instead of torch elastic's
  poll (which ends every worker when one fails): a lost rank's process is handed to a
  standby and the group stays HEALTHY, or the group FAILED as before, with one line
  saying why.
- ``_monitor_workers`` also decides, with ``restart_policy``
  (:mod:`rankguard.ft.policy`), whether a restart can help: a failure that will repeat
  (a fingerprint) sets the restart budget to 0 and :attr:`RankguardAgent.stop_decision`.
- ``_restart_workers``: report each restart and its cause (a finding the launcher acted
  on, or that root cause) and its decision before the agent restarts the group as usual.
- ``_stop_workers``: stop the group with our grace period (SIGTERM, wait, SIGKILL).
- preemption (``preemption.enable_exit_handler``): the exit signal is handed to the
  :class:`~rankguard.preempt.coordinator.PreemptionCoordinator` instead of torch's
  handler (the workers are not stopped); while the job is preempted ``_monitor_workers``
  neither restarts the group nor records its exits as a failure, kills the ranks still
  running when ``preempt_time`` is over, and ``_exit_barrier`` waits no longer than
  the grace window; once live recovery took a lost node's ranks over (its agent never
  arrives), it waits ``LOST_NODE_EXIT_S`` at most.
- ``run``: while it runs, one private directory for the ranks' NVRx client sockets,
  removed when it ends whatever the ranks did (``launcher_socket_dir`` in
  ``integrations/nvrx.py``: a rank killed by a signal leaves nothing in ``$TMPDIR``).
- ``_shutdown``: whichever signal stopped the launcher (SIGTERM, SIGINT, SIGHUP,
  SIGQUIT), the workers get SIGTERM, then SIGKILL after the same grace period: torch
  elastic would pass the launcher's own signal on, so a closed terminal (SIGHUP) would
  kill a rank before its SIGTERM handler (a checkpoint on preemption) could run, and
  SIGQUIT would dump its core.

:attr:`RankguardAgent.workers` is the registry of the current workers (pid and start
time, taken as the group starts, emptied as it stops): fault tolerance signals no other
process (:mod:`rankguard.ft.kill`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from string import Template
from types import FrameType
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import MultiprocessContext, SubprocessContext
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from rankguard.ft.failure import WorkerFailure
from rankguard.ft.kill import OwnedWorkers
from rankguard.integrations.nvrx import launcher_socket_dir
from rankguard.launcher.handover import HandoverResult, wait_for_handover
from rankguard.schema.exits import EXIT_RERUN_VALIDATION_FAILED
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import RestartCause, RestartEntry
from rankguard.util.procs import pid_running

if TYPE_CHECKING:
    from rankguard.ft.decide import Decision
    from rankguard.ft.policy import RestartPolicy
    from rankguard.launcher.exclusion import NodeExclusion
    from rankguard.launcher.forkwait import ForkWait
    from rankguard.launcher.live import LiveRecovery
    from rankguard.preempt.coordinator import PreemptionCoordinator

__all__ = [
    "RESTART_NODES_JOINED",
    "RankguardAgent",
    "TracebackInMessage",
    "add_peer_errors",
    "drop_torn_error_files",
    "first_failure",
    "launcher_env_changes",
    "worker_pids",
    "worker_stop_signal",
]

logger = logging.getLogger(__name__)

LOST_NODE_EXIT_S = 3
"""torch elastic's exit barrier after live recovery took a lost node's ranks over (its
agent never arrives): the surviving agents wait this long for each other, not
``exit_barrier_timeout`` (300 s by default)."""

_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

RESTART_NODES_JOINED = "nodes_joined"
"""The cause of a restart with no failure: nodes waited to join an elastic job's group
(``restarts.jsonl``'s ``cause``; not a finding)."""


def worker_stop_signal(received: int) -> signal.Signals:
    """The signal the workers get when the launcher stops them after receiving
    ``received``: SIGTERM for each of the launcher's stop signals (``_SIGNALS``), else
    ``received`` itself."""
    names = {getattr(signal, name, None) for name in _SIGNALS}
    return signal.SIGTERM if received in names else signal.Signals(received)


def first_failure(result: Any) -> WorkerFailure | None:
    """The first failure of a RunResult (the root cause): a rank killed by a signal
    first, else the earliest error file."""
    failures = getattr(result, "failures", None) or {}
    if not failures:
        return None
    rank, failure = min(failures.items(), key=lambda kv: (_cause_rank(kv[1]), kv[0]))
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message") or message.get("extraInfo", {}).get("py_callstack")
    return WorkerFailure(
        rank=rank,
        local_rank=failure.local_rank,
        pid=failure.pid,
        exit_code=failure.exitcode,
        signal=failure.signal_name() if failure.exitcode < 0 else None,
        error=str(message)[-2000:] if message else None,
        error_file=failure.error_file,
    )


def drop_torn_error_files(error_files: dict[int, str]) -> list[str]:
    """Delete the workers' error files that are not valid JSON (cut short by a kill);
    the paths deleted."""
    torn = []
    for path in error_files.values():
        try:
            with open(path, encoding="utf-8") as fh:
                json.load(fh)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(path)
                torn.append(path)
    return torn


def add_peer_errors(
    failures: dict[int, Any],
    error_files: dict[int, str],
    pids: dict[int, int],
    global_rank: Callable[[int], int],
) -> None:
    """Add to a single reported failure the ranks that also left an error file (they
    raised: torch's process wrapper exits with 1 after writing it)."""
    if len(failures) != 1:
        return
    for local_rank, path in error_files.items():
        rank = global_rank(local_rank)
        if rank in failures or not os.path.isfile(path):
            continue
        try:
            failures[rank] = ProcessFailure(
                local_rank=local_rank, pid=pids.get(local_rank, -1), exitcode=1, error_file=path
            )
        except Exception:
            logger.exception("rankguard: unreadable error file %s", path)


def worker_pids(started: Any, pcontext: Any) -> list[int]:
    """The pids of a just-started worker group: what ``_start_workers`` returned (local
    rank -> pid in torch 2.4 and later), else the process context's ``pids()``. With
    ``--preload`` they are the forked ranks themselves, not the fork server."""
    pids = started if isinstance(started, dict) else None
    if pids is None and pcontext is not None and callable(getattr(pcontext, "pids", None)):
        pids = pcontext.pids()
    if not isinstance(pids, dict):
        logger.warning("rankguard: the agent reports no worker pids: no kill will be allowed")
        return []
    return [int(pid) for pid in pids.values() if isinstance(pid, int)]


class TracebackInMessage(logging.Filter):
    """torch's multiprocessing context logs a forked rank's failure with its exception
    (``logger.exception``), and torch's log formatter imports ``torch._dynamo`` to
    format any record that carries one: about a second of imports in the middle of the
    first restart, and the launcher then holds ``torch._dynamo`` to its exit (its
    rendezvous shutdown and its interpreter's teardown walk it: 0.3-0.4 s of CPU, 1.5-2 s
    of wall on a busy 2-core machine, after every ``--preload`` job).

    This filter, on that logger only, puts the traceback into the message (as
    ``logging.Formatter.formatException`` writes it) and the record carries no
    exception any more: the same lines reach the console, and nothing is imported."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.msg = f"{record.getMessage()}\n{text}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_FORKED_FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def _plain_failure_logging(pcontext: Any) -> None:
    """Forked ranks (``--preload``): their failures logged without ``torch._dynamo``
    (:class:`TracebackInMessage`), once per process."""
    if not isinstance(pcontext, MultiprocessContext):
        return
    log = logging.getLogger(_FORKED_FAILURE_LOGGER)
    if not any(isinstance(f, TracebackInMessage) for f in log.filters):
        log.addFilter(TracebackInMessage())


def launcher_env_changes(inherited: Mapping[str, str], now: Mapping[str, str]) -> dict[str, str]:
    """The variables set or changed in ``now`` since ``inherited`` (the environment the
    fork server started with): what a rank started as a new interpreter finds and a
    forked one would miss (torch elastic's signals to handle, NVRx's socket directory,
    set after the fork server started). A variable removed since cannot be passed on:
    torch elastic's per-worker environment only sets."""
    return {k: v for k, v in now.items() if inherited.get(k) != v}


def _worker_processes(pcontext: Any) -> dict[int, Any]:
    """local rank -> the worker's process (a ``subprocess.Popen`` for ranks started as
    a command, a ``multiprocessing`` process for ranks forked by ``--preload``); empty
    for any other context."""
    if isinstance(pcontext, SubprocessContext):
        handlers = getattr(pcontext, "subprocess_handlers", None) or {}
        return {r: h.proc for r, h in handlers.items() if getattr(h, "proc", None) is not None}
    if isinstance(pcontext, MultiprocessContext):
        procs = getattr(getattr(pcontext, "_pc", None), "processes", None) or []
        return dict(enumerate(procs))
    return {}


def _cause_rank(failure: Any) -> tuple[int, float]:
    """Order failures by how likely each is the cause. A rank killed by a signal other
    than SIGTERM wrote no error file (its timestamp is only when the agent noticed) and
    comes first; then real errors by time; SIGTERM last: when one worker fails, torch
    elastic terminates the others with it."""
    by_signal = failure.exitcode < 0
    sigterm = by_signal and -failure.exitcode == signal.SIGTERM
    when = float(failure.timestamp)  # whole seconds in the error file: ties are common
    with contextlib.suppress(OSError, TypeError):  # no file (a signal): the timestamp
        when = os.stat(failure.error_file).st_mtime_ns / 1e9
    return (2 if sigterm else 0 if by_signal else 1), when


def _final_verdict(failure: WorkerFailure) -> bool:
    """A failure a restart in the job cannot help, by the rerun state machine's verdict:
    exit 17 (this hardware was faulty: the scheduler excludes the node) or a fault that
    reproduced after the resume (a data or model problem)."""
    if failure.exit_code == EXIT_RERUN_VALIDATION_FAILED:
        return True
    return "ReproducibleFaultError" in (failure.error or "")


class RankguardAgent(LocalElasticAgent):
    def __init__(
        self,
        *args: Any,
        on_signal: Callable[[str], None] | None = None,
        on_restart: Callable[[int, RestartCause | None], None] | None = None,
        on_failure: Callable[[RestartCause], None] | None = None,
        grace_s: float = 30.0,
        preemption: PreemptionCoordinator | None = None,
        handover_timeout_s: float = 30.0,
        restart_policy: RestartPolicy | None = None,
        live: LiveRecovery | None = None,
        on_live_recovery: Callable[[RestartEntry], None] | None = None,
        fork_env: Mapping[str, str] | None = None,
        fork_wait: ForkWait | None = None,
        **kw: Any,
    ) -> None:
        # torch elastic's own grace when a signal stops it or the job ends: ours.
        kw.setdefault("shutdown_timeout", max(1, round(grace_s)))
        # rankguard's ``$node`` in the line prefix template: the group rank, known
        # once the round is agreed (torch's template knows role, rank and local rank)
        self._line_prefix: str | None = kw.get("log_line_prefix_template")
        super().__init__(*args, **kw)
        self._on_signal = on_signal
        self._on_restart = on_restart
        self._on_failure = on_failure
        self._grace_s = grace_s
        self._cause: JsonObject | None = None  # the finding acted on, as written
        self._before_cause: tuple[JsonObject | None, bool, int] | None = None
        self.last_failure: WorkerFailure | None = None
        self.aborted = False
        self.restarts = 0
        self._cause_lock = threading.Lock()
        # --preload: the environment the fork server started with (None: no fork server)
        self._fork_env = None if fork_env is None else dict(fork_env)
        self._fork_wait = fork_wait  # --preload: the fork waits for the server's imports
        self.workers = OwnedWorkers()  # the only processes fault tolerance may signal
        self.preemption = preemption
        self.handover_timeout_s = handover_timeout_s
        self.last_handover: HandoverResult | None = None
        self.exclusion: NodeExclusion | None = None
        self.restart_policy = restart_policy
        self.stop_decision: Decision | None = None  # the policy stopped the job
        self._decision: Decision | None = None  # the decision behind the next restart
        self.live = live  # standbys: a lost rank replaced in place (launcher/live.py)
        if live is not None and live.on_started is None:  # a refilled standby is a worker
            live.on_started = self.workers.add
        self._on_live_recovery = on_live_recovery

    # ---- the launcher's side ---------------------------------------------------------

    def set_cause(self, finding: JsonObject, *, abort: bool) -> None:
        """The launcher is about to kill a worker because of ``finding``."""
        with self._cause_lock:
            self._before_cause = (self._cause, self.aborted, self._remaining_restarts)
            self._cause = finding
            if abort:
                self.aborted = True
                self._remaining_restarts = 0

    def withdraw_cause(self, finding: JsonObject) -> None:
        """The kill for ``finding`` did not happen: no restart (or abort) because of it;
        the cause, the abort and the restart budget are as they were before it."""
        with self._cause_lock:
            if self._cause is finding and self._before_cause is not None:
                self._cause, self.aborted, self._remaining_restarts = self._before_cause
                self._before_cause = None

    def attach_exclusion(self, exclusion: NodeExclusion) -> None:
        """Bad-node exclusion: each failure of this node's group is told to
        ``exclusion`` (restarts it caused, exit 17's faulty GPU)."""
        self.exclusion = exclusion

    def _note_exclusion(self, worker_group: Any) -> bool:
        """Tell the exclusion of this failure; True when it takes over an exit 17 (the
        group restarts without the faulty node instead of ending the job)."""
        failure, exclusion = self.last_failure, self.exclusion
        if failure is None or exclusion is None:
            return False
        try:
            record = failure.to_dict()
            exclusion.note_failure(record, [w.global_rank for w in worker_group.workers])
            return exclusion.final_verdict_taken(record)
        except Exception:
            logger.exception("rankguard: exclusion failed to note the failure")
            return False

    def attach_preemption(self, coordinator: PreemptionCoordinator) -> None:
        """Preemption: the exit signal goes to ``coordinator`` (see the module doc)."""
        self.preemption = coordinator

    @property
    def pending_cause(self) -> JsonObject | None:
        """A finding acted on after the last restart, as its ``findings.jsonl`` line:
        what ended the job, if it ended."""
        return self._cause

    # ---- lifecycle extensions --------------------------------------------------------

    def run(self, *args: Any, **kw: Any) -> Any:
        with launcher_socket_dir():
            return super().run(*args, **kw)

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        if self._line_prefix and "$node" in self._line_prefix:
            self._log_line_prefix_template = Template(self._line_prefix).safe_substitute(
                node=worker_group.group_rank
            )
        wait = self._fork_wait
        if wait is not None:
            wait.forking()
        try:
            pids: dict[int, Any] = super()._start_workers(worker_group)
        finally:
            if wait is not None:
                wait.forked()
        self.workers.set(worker_pids(pids, getattr(self, "_pcontext", None)))
        if self.live is not None:  # torch elastic's TORCHELASTIC_RESTART_COUNT
            self.live.started(
                worker_group, worker_group.spec.max_restarts - self._remaining_restarts
            )
        _plain_failure_logging(self._pcontext)
        if self._on_signal is not None and threading.current_thread() is threading.main_thread():
            sigs = {getattr(signal, name, None) for name in _SIGNALS}
            if self.preemption is not None:  # SIGUSR1/2 too: not torch elastic's signals
                sigs.add(self.preemption.sig)
            for sig in sigs:
                if sig is not None:
                    self._chain(sig)
        return pids

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        """torch elastic's last step before it starts the workers, with each worker's
        environment: with ``--preload``, the launcher's variables set since the fork
        server started are added to it (torch elastic's own per-worker variables win),
        so a forked rank finds what a new interpreter inherits."""
        if self._fork_env is not None:
            changes = launcher_env_changes(self._fork_env, os.environ)
            for env in envs.values():
                for key, value in changes.items():
                    env.setdefault(key, value)
        super()._setup_local_watchdog(envs)

    def _monitor_workers(self, worker_group: Any) -> Any:
        # the ranks as processes (a command) or forked by --preload's fork server
        if self.live is not None and isinstance(
            self._pcontext, (SubprocessContext, MultiprocessContext)
        ):
            result = self._monitor_live(worker_group, self.live)
        else:
            result = self._poll_workers(worker_group)
        pre = self.preemption
        if pre is not None and pre.active:
            return self._preempted_result(worker_group, result, pre)
        if result.is_failed() and self.last_failure is None:
            self._add_peer_errors(result, worker_group)
            self.last_failure = first_failure(result)
            taken = self._note_exclusion(worker_group)
            if self.last_failure is not None and _final_verdict(self.last_failure) and not taken:
                self._remaining_restarts = 0
                self.aborted = True
            self._decide(worker_group)
            root = self.last_failure.cause() if self.last_failure is not None else None
            if root is not None and self._on_failure is not None:
                try:  # the monitor names the same culprit (it sees exits, not exit codes)
                    self._on_failure(root)
                except Exception:
                    logger.exception("rankguard: failure callback failed")
        return result

    def _monitor_live(self, worker_group: Any, live: LiveRecovery) -> Any:
        """Standbys: this node's workers watched by :mod:`.live` (a lost rank replaced
        in place); a cause a finding's kill left is that recovery's."""
        pre = self.preemption
        live.stopping = (
            "the job is preempted"
            if pre is not None and pre.active
            else "the job is aborted"
            if self.aborted
            else None
        )
        used = len(live.replaced)
        result = live.poll(worker_group, self._pcontext)
        if len(live.replaced) > used:
            with self._cause_lock:
                cause, self._cause = self._cause, None
            if cause is not None:  # fault tolerance killed it for this finding
                live.replaced[-1]["cause"] = cause.get("finding_type") or live.replaced[-1]["cause"]
        final = result.state != WorkerState.HEALTHY
        for entry in live.entries_due(final=final):
            if self._on_live_recovery is not None:
                try:
                    self._on_live_recovery(entry)
                except Exception:
                    logger.exception("rankguard: live recovery notification failed")
        return result

    def _poll_workers(self, worker_group: Any) -> Any:
        """torch elastic's own poll of the workers (torn error files dropped), after a
        look of our own for a worker killed by a signal (:meth:`_note_killed_first`)."""
        self._note_killed_first(worker_group)
        try:
            result = super()._monitor_workers(worker_group)
        except ValueError:
            # torch parses each failed worker's error file; a worker terminated while
            # writing it (SIGTERM to the group's survivors) leaves it torn, and torch's
            # agent would die on it. Drop the torn files (torch then names the exit
            # code or signal instead) and look again.
            torn = drop_torn_error_files(getattr(self._pcontext, "error_files", {}))
            if not torn:
                raise
            logger.warning("rankguard: torn worker error file(s) dropped: %s", torn)
            result = super()._monitor_workers(worker_group)
        return result

    def _note_killed_first(self, worker_group: Any) -> None:
        """torch elastic's poll, once it sees a worker fail, stops the others (SIGTERM,
        then waits for them) before it returns the failure: the monitor, scanning
        meanwhile, sees the peers vanish with the worker killed first and, without the
        exit codes, cannot tell them apart (on a loaded machine it named a peer the
        agent had terminated). A worker killed by a signal other than SIGTERM, found
        here before that poll, is named to the monitor first (``on_failure``; the agent
        names it again with the poll's result: the same rank). Ranks as processes or
        forked (``--preload``); the processes' own exit status, reaped here as torch's
        poll would (it then reads the same code)."""
        if self._on_failure is None or self.last_failure is not None:
            return
        exited = []
        for local_rank, proc in _worker_processes(self._pcontext).items():
            try:
                code = proc.poll() if hasattr(proc, "poll") else proc.exitcode
            except Exception:  # the process table could not tell: torch's poll will
                continue
            if isinstance(code, int) and code < 0 and -code != signal.SIGTERM:
                exited.append((local_rank, proc.pid, code))
        if not exited:
            return
        ranks = {w.local_rank: w.global_rank for w in worker_group.workers}
        local_rank, pid, code = min(exited, key=lambda e: (ranks.get(e[0], e[0]), e[0]))
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        failure = WorkerFailure(
            rank=ranks.get(local_rank, local_rank),
            local_rank=local_rank,
            pid=int(pid),
            exit_code=code,
            signal=name,
        )
        try:
            self._on_failure(failure.cause())
        except Exception:
            logger.exception("rankguard: failure callback failed")

    def _decide(self, worker_group: Any) -> None:
        """Restart or stop (:mod:`rankguard.ft.policy`), while the budget lasts."""
        policy, failure = self.restart_policy, self.last_failure
        if policy is None or failure is None or self._remaining_restarts <= 0:
            return
        pids = {w.global_rank: w.id for w in worker_group.workers if isinstance(w.id, int)}
        try:
            decision = policy.after_failure(failure, self._cause, pids)
        except Exception:  # no decision: torch elastic's restart, as without a policy
            logger.exception("rankguard: the restart decision failed")
            return
        self._decision = decision
        if decision.stop:
            self.stop_decision = decision
            self._remaining_restarts = 0

    def _preempted_result(self, worker_group: Any, result: Any, pre: PreemptionCoordinator) -> Any:
        """The job is preempted: no restart, no failure recorded; at the end of the
        grace window the ranks still running are killed."""
        if result.state == WorkerState.HEALTHY and pre.expired():
            running = {
                w.id: w.global_rank
                for w in worker_group.workers
                if isinstance(w.id, int) and pid_running(w.id)
            }
            pre.note_terminated(sorted(running), sorted(running.values()))
            if self._on_signal is not None:  # their ends are rankguard's kill, not failures
                self._on_signal(pre.kill_reason())
            if self._pcontext is not None:
                self._pcontext.close(signal.SIGKILL, 1)
            result = super()._monitor_workers(worker_group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            self._remaining_restarts = 0  # a preempted job is requeued, not restarted
        return result

    def _exit_barrier(self) -> None:
        pre = self.preemption
        if pre is not None and pre.active:  # the other nodes have the same window
            left = pre.time_left() or 0.0
            self._exit_barrier_timeout = max(1, round(left))
        live = self.live
        if live is not None and live.node_lost:  # a lost agent never reaches the barrier
            self._exit_barrier_timeout = min(self._exit_barrier_timeout, LOST_NODE_EXIT_S)
        super()._exit_barrier()

    def _add_peer_errors(self, result: Any, worker_group: Any) -> None:
        """Ranks forked by the fork server (``--preload``) run in torch's multiprocessing
        context, which reports one failure per group (the first it looks at, often a
        peer that failed *because* of the culprit) and terminates the rest. Peers that
        raised left their error files: add them, so the earliest error is the cause."""
        pcontext = self._pcontext
        if isinstance(pcontext, MultiprocessContext):
            add_peer_errors(
                result.failures,
                pcontext.error_files,
                pcontext.pids(),
                lambda local_rank: worker_group.workers[local_rank].global_rank,
            )

    def _restart_workers(self, worker_group: Any) -> None:
        with self._cause_lock:
            acted, self._cause = self._cause, None
        failure, self.last_failure = self.last_failure, None
        cause = (
            RestartCause.from_dict(acted)
            if acted is not None
            else failure.cause()
            if failure is not None
            else None
        )
        if cause is None and worker_group.state == WorkerState.HEALTHY:
            cause = self._membership_cause(worker_group)
        self.restarts += 1
        decision, self._decision = self._decision, None
        if decision is not None:
            cause = replace(cause or RestartCause(), decision=decision.to_dict())
        if self._on_restart is not None:
            try:
                self._on_restart(self.restarts, cause)
            except Exception:
                logger.exception("rankguard: restart notification failed")
        t0 = time.monotonic()
        super()._restart_workers(worker_group)
        logger.info("rankguard: worker group restarted in %.2fs", time.monotonic() - t0)

    def _membership_cause(self, worker_group: Any) -> RestartCause | None:
        """A restart without a failure: torch's agent restarts a healthy group when
        nodes wait to join it (an elastic ``--nnodes MIN:MAX`` job below MAX, a node
        back after a loss). Named, not left an unknown cause."""
        try:
            waiting = int(worker_group.spec.rdzv_handler.num_nodes_waiting())
        except Exception as exc:  # the store is busy or gone: the cause stays unknown
            logger.debug("rankguard: cannot ask the rendezvous who waits: %s", exc)
            return None
        if waiting <= 0:
            return None
        return RestartCause(
            finding_type=RESTART_NODES_JOINED,
            message=f"{waiting} node(s) waiting to join: the group restarts to take "
            "them in (elastic --nnodes MIN:MAX)",
        )

    def _stop_workers(self, worker_group: Any) -> None:
        old = sorted(self.workers.pids())
        self.workers.clear()
        self._shutdown(timeout=max(1, round(self._grace_s)))
        # the next group starts only once the old one is gone and its GPU memory freed
        self.last_handover = wait_for_handover(old, timeout_s=self.handover_timeout_s)
        if self.last_handover.waited_s >= 0.5:
            logger.info(
                "rankguard: old workers gone in %.2fs (%s)",
                self.last_handover.waited_s,
                self.last_handover.describe(),
            )

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        super()._shutdown(worker_stop_signal(death_sig), timeout)

    # ---- signals ---------------------------------------------------------------------

    def _chain(self, sig: signal.Signals) -> None:
        previous = signal.getsignal(sig)
        notify = self._on_signal
        assert notify is not None
        if getattr(previous, "_rankguard_chained", False):
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            pre = self.preemption
            if pre is not None and pre.claims(signum):
                return  # preemption: the ranks save first (flags only here)
            try:
                notify(signal.Signals(signum).name)
            except Exception:
                logger.exception("rankguard: signal notification failed")
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        handler._rankguard_chained = True  # type: ignore[attr-defined]
        signal.signal(sig, handler)
