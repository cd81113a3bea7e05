"""What the launcher does about a finding: report, restart or abort.

For ``restart`` and ``abort`` (per finding type, ``fault_tolerance.actions``), before
anything is killed the Python stacks of the culprit and of every other rank are written
(:mod:`.stacks`) and the finding names the files. Then the culprit is SIGKILLed: torch
elastic's agent sees the worker group fail and stops the rest of it (SIGTERM, grace,
SIGKILL) and, within ``num_in_job_restarts``, starts it again after a new rendezvous
(:class:`~rankguard.launcher.agent.RankguardAgent` records each restart and its cause).
``abort`` spends no restart: the job ends with ``EXIT_NO_RESTART``. A culprit on another
node is dumped and killed by that node's relay, on request through the store.

Only this node's workers are signalled: with the agent's registry of its workers
(``workers``), a record naming any other local pid (a forged relayed record, a pid
reused since) is refused and logged, the finding saying so.

One fault, one action: while a restart is under way, further findings (the peers of a
dead rank going stale) are recorded but not acted on. That state ends when the agent
starts the new group (:meth:`FaultHandler.restarted`), or when the agent saw no group
failure (:meth:`FaultHandler.group_failed`) within ``busy_grace_s`` of the action: a
finding that stopped nothing (a forged ``process_end``: no worker failed) must not
disarm fault tolerance for the rest of the job. An action that fails (the kill,
the agent, the store) ends that state, so the next fault is acted on again, and leaves
no mark: the agent's cause (and an abort) and the monitor's restart notice are
withdrawn, so later exits are findings again, not a restart's doing; stacks that
could not be written (a full disk) do not stop the kill: the finding says which dumps
failed and why (``stack_dump_errors``).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.flightrec import collect_verdict
from rankguard.ft.kill import (
    NOT_A_WORKER,
    DumpPolicy,
    KillTarget,
    WorkerRegistry,
    dump_stacks_of,
    kill_marked,
)
from rankguard.monitor.api import FindingSink
from rankguard.monitor.rules import NAMED_AT, RUN_END
from rankguard.monitor.verdicts.evidence import p2p_wait
from rankguard.schema.findings import Finding, FindingType, Liveness
from rankguard.schema.jsontypes import JsonObject
from rankguard.util.procs import pid_running, process_state

if TYPE_CHECKING:
    from rankguard.ft.frremote import RemoteTraces
    from rankguard.monitor.rules import HeartbeatRules
    from rankguard.schema.records import HeartbeatRecord

__all__ = ["LIVE_RECOVERY", "AgentControl", "FaultHandler", "HangTraces"]

LIVE_RECOVERY = "live_recovery"
"""A finding's ``detail`` key when live recovery already acted on it (a standby took the
lost rank's place): its ``action`` says so, fault tolerance takes none."""

logger = logging.getLogger(__name__)


class AgentControl(Protocol):
    def set_cause(self, finding: JsonObject, *, abort: bool) -> None: ...

    def withdraw_cause(self, finding: JsonObject) -> None: ...


class MonitorView(Protocol):
    """What the handler needs of the job monitor: its ranks and the restart notice."""

    @property
    def rules(self) -> HeartbeatRules: ...

    def note_restart(self, reason: str) -> None: ...


RemoteKill = Callable[[int, list[JsonObject]], None]


class HangTraces(FindingSink):
    """A hang's finding gets the ranks' flight-recorder verdict (``ft/flightrec.py``:
    who did not join which collective) in its message and ``flight_recorder``, whatever
    is done about it: a sink of its own when fault tolerance is off, and
    :class:`FaultHandler` calls :meth:`attach` for every hang it handles. The ranks
    asked are the live ones that ``here`` accepts (this node's), not stopped, and, with
    ``remote`` (:class:`~rankguard.ft.frremote.RemoteTraces`), the live ranks of the
    other nodes whose heartbeats still arrive (a rank past its heartbeat timeout cannot
    answer: a lost node's), through their relays: every node's traces are compared
    together. One
    request serves the findings of one hang: a verdict taken less than ``reuse_s`` ago
    over the same ranks is reused (each stalled rank is a finding)."""

    def __init__(
        self,
        run_dir: Path,
        monitor: MonitorView,
        *,
        here: Callable[[HeartbeatRecord], bool] | None = None,
        remote: RemoteTraces | None = None,
        reuse_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.monitor = monitor
        self.hostname = socket.gethostname()
        self.here = here or (lambda rec: rec.hostname == self.hostname)
        self.remote = remote
        self.reuse_s = reuse_s
        self.clock = clock
        self._last: tuple[float, list[int], Any] | None = None

    def before_write(self, finding: Finding) -> None:
        if finding.finding_type.info.hang:
            self.attach(finding)

    def attach(self, finding: Finding) -> None:
        ranks: list[int] = []
        elsewhere: dict[int, list[int]] = {}  # node -> its live ranks (another node's)
        for rank, state in sorted(self.monitor.rules.ranks.items()):
            rec = state.record
            if rec is None or rec.ended:
                continue
            if self.here(rec):
                # stopped, or gone (a culprit killed before its finding): cannot answer
                if process_state(rec.pid) not in (None, "T", "t", "Z", "X"):
                    ranks.append(rank)
            elif self.remote is not None and rec.node_rank:  # its relay judges the pid
                if state.liveness is Liveness.STALE:
                    # no record from it for its timeout: its process, its node (a lost
                    # node's relay never answers) or its relay is gone or stuck, and
                    # node 0 would wait the whole request's timeout for its trace
                    continue
                elsewhere.setdefault(rec.node_rank, []).append(rank)
        asked = ranks + sorted(r for rs in elsewhere.values() for r in rs)
        if not asked:
            return
        now = self.clock()
        last = self._last
        if last is not None and last[1] == asked and now - last[0] < self.reuse_s:
            verdict = last[2]
        else:
            # the other nodes first: their ranks dump while this node's do
            wait = self.remote.ask(elsewhere) if self.remote is not None and elsewhere else None
            world = len(self.monitor.rules.ranks)
            p2p = [r for r, st in self.monitor.rules.ranks.items() if p2p_wait(st)]
            verdict = collect_verdict(self.run_dir, ranks, remote=wait, world=world, waiting=p2p)
            self._last = (now, asked, verdict)
        if verdict is not None:
            finding.detail["flight_recorder"] = verdict.to_dict()
            finding.message = f"{finding.message}; {verdict.line}"


class FaultHandler(FindingSink):
    """A finding sink: :meth:`before_write` decides the action and dumps the stacks
    (named in the finding), :meth:`after_write` kills the culprit.

    ``workers``: the processes this launcher may signal (the agent's current workers);
    None trusts the records' pids (for a caller that started them itself).
    ``remote_traces``: the other nodes' flight-recorder traces on a hang (their relays).
    ``busy_grace_s``: how long after an action the agent has to see its group fail
    (default: two stack dump timeouts, the termination grace and 30 s for the agent and
    the relays to notice).
    ``replaced_live``: whether a standby takes a rank's place when its process ends (live
    recovery, this node's launcher). For a hang of such a rank restarted, the culprit is
    killed as soon as its own stacks are written: the other ranks keep running (their
    dumps, taken from the same moment, go on meanwhile) and the standby need not wait
    for them. The finding is written after every dump, as otherwise."""

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        run_dir: Path,
        monitor: MonitorView,
        agent: AgentControl,
        *,
        remote_kill: RemoteKill | None = None,
        remote_traces: RemoteTraces | None = None,
        workers: WorkerRegistry | None = None,
        busy_grace_s: float | None = None,
        replaced_live: Callable[[int], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.replaced_live = replaced_live
        self._acted_early: Finding | None = None  # killed before it was written
        self._killed: tuple[int, int] | None = None  # (rank, pid) of the last kill here
        self.workers = workers
        self.run_dir = Path(run_dir)
        self.monitor = monitor
        self.agent = agent
        self.remote_kill = remote_kill
        self.hostname = socket.gethostname()
        self.actions_taken = 0
        self.action_errors = 0
        self._busy = False
        self._lock = threading.Lock()
        self.clock = clock
        self.busy_grace_s = (
            busy_grace_s
            if busy_grace_s is not None
            else 2 * cfg.stack_dump_timeout_s + cfg.termination_grace_s + 30.0
        )
        self.busy_expired = 0  # actions after which no group failure came
        self._acted_at: float | None = None  # when the action under way was taken
        self._failure_seen = False
        self._undo: tuple[JsonObject | None, str] | None = None  # its cause, reason
        self._pending: JsonObject | None = None  # the cause given the agent before dumps
        self.traces = HangTraces(
            self.run_dir, monitor, here=self._dumps_here, remote=remote_traces, clock=clock
        )

    def killed(self, rank: int, pid: int) -> bool:
        """Whether this handler's last kill here was rank ``rank``'s process ``pid`` (its
        end is that action's doing: the finding that caused it names the rank)."""
        return self._killed == (rank, pid)

    def restarted(self) -> None:
        """The agent started a new worker group: act on the next fault again."""
        with self._lock:
            self._busy = False
            self._acted_at = None
            self._undo = None

    def group_failed(self) -> None:
        """The agent saw its worker group fail: the restart under way is real."""
        with self._lock:
            self._failure_seen = True

    def _expire(self) -> None:
        """Called with the lock held: end a busy state no group failure followed."""
        if not self._busy or self._failure_seen or self._acted_at is None:
            return
        waited = self.clock() - self._acted_at
        if waited <= self.busy_grace_s:
            return
        self.busy_expired += 1
        cause, reason = self._undo or (None, "")
        logger.warning(
            "rankguard: no worker group failure %.0fs after the %s (busy_grace_s=%g): "
            "nothing was stopped; acting on faults again",
            waited,
            reason or "last action",
            self.busy_grace_s,
        )
        if cause is not None:
            self.agent.withdraw_cause(cause)
        if reason:
            self.monitor.rules.cancel_restart(reason)
        self._busy = False
        self._acted_at = None
        self._undo = None

    # ---- before the finding is written -----------------------------------------------

    def before_write(self, finding: Finding) -> None:
        if LIVE_RECOVERY in finding.detail:
            return  # a standby took the rank's place: the launcher acted, no restart
        named = finding.detail.get(NAMED_AT)
        if named is not None:  # its group is being replaced, or the run is over
            finding.action = (
                "none (the run had ended)"
                if named == RUN_END
                else f"none (a restart was already under way: {named})"
            )
            return
        ftype = finding.finding_type
        action = self.cfg.actions.get(ftype.value, "report")
        label = action
        if action != "report" and ftype is not FindingType.PROCESS_EXITED:
            blocker = self._cannot_act(finding)
            if blocker:
                label, action = f"report ({action} impossible: {blocker})", "report"
        with self._lock:
            self._expire()
            if action != "report" and self._busy:
                finding.action = "none (a restart is already under way)"
                return
            finding.action = label
            if action != "report":
                self._busy = True
                self._acted_at = None
                self._failure_seen = False
        if action == "report":
            if ftype.info.hang:  # the verdict belongs to the finding, acted on or not
                self.traces.attach(finding)
            return
        if ftype is FindingType.PROCESS_EXITED:
            return  # nothing left to dump: the process is gone
        # The agent knows the cause before the dumps: a culprit that dies while it is
        # dumped (a stopped process resumed to write its stacks) restarts the group
        # for this finding, not as an unexplained worker failure. ``_act`` completes it.
        pending = finding.to_dict()
        try:
            self.agent.set_cause(pending, abort=action == "abort")
            self._pending = pending
        except Exception:  # ``_act`` tries again, and a failure there is counted
            self._pending = None
        errors: dict[str, str] = {}
        early = None
        if action == "restart" and self._replaced_live(finding.rank):
            early = functools.partial(self._kill_early, finding)
        try:
            finding.stack_dumps = self._dump_all(finding.rank, errors, early)
        except Exception as exc:  # no stacks, but the kill goes ahead
            logger.exception("rankguard: stack dumps before the %s failed", action)
            finding.stack_dumps = {}
            errors[str(finding.rank)] = f"{type(exc).__name__}: {exc}"
        finding.stack_dump = finding.stack_dumps.get(str(finding.rank))
        if errors:
            finding.detail["stack_dump_errors"] = {**errors}
        if ftype.info.hang:
            self.traces.attach(finding)
        if self._acted_early is finding and pending is not None:
            pending.update(finding.to_dict())  # the agent's cause: now with the dumps

    def _replaced_live(self, rank: int) -> bool:
        """A standby takes the culprit's place (its kill ends no other rank here)."""
        state = self.monitor.rules.ranks.get(rank)
        rec = state.record if state is not None else None
        if self.replaced_live is None or rec is None or not self._dumps_here(rec):
            return False
        try:
            return self.replaced_live(rank)
        except Exception:
            logger.exception("rankguard: asking live recovery about rank %d failed", rank)
            return False

    def _kill_early(self, finding: Finding, _culprit: object = None) -> None:
        """The culprit's stacks are in: kill it now (live recovery replaces it), the
        others' dumps going on; :meth:`after_write` then has nothing left to do."""
        try:
            self._act(finding)
        except Exception:
            self.action_errors += 1
            logger.exception("rankguard: the kill of rank %d failed", finding.rank)
            with self._lock:
                self._busy = False
            return
        self._acted_early = finding

    def _cannot_act(self, finding: Finding) -> str | None:
        """Why the culprit cannot be killed (then nothing restarts: stay armed)."""
        state = self.monitor.rules.ranks.get(finding.rank)
        if state is None or state.record is None:
            return "the rank has no process to stop"
        host = state.record.hostname
        if host != self.hostname and self.remote_kill is None:
            return f"the rank runs on {host}, which this launcher cannot reach"
        return None

    def _dumps_here(self, rec: HeartbeatRecord) -> bool:
        """Whether this launcher dumps and kills the rank of ``rec`` itself: it runs on this
        host and, when the other nodes can be asked, on this node (another node's rank
        writes its stacks into that node's run directory, even on this host)."""
        if self.remote_kill is not None and (rec.node_rank or 0) != 0:
            return False
        return rec.hostname == self.hostname

    def _dump_all(
        self,
        culprit: int,
        errors: dict[str, str],
        on_culprit: Callable[[Any], None] | None = None,
    ) -> dict[str, str]:
        """Stack file (or where it is dumped, or "failed") per rank; why each failed
        dump failed into ``errors``. ``on_culprit``: called once the culprit's is in."""
        ranks = self.monitor.rules.ranks
        order = sorted(ranks, key=lambda r: (r != culprit, r))
        local: list[KillTarget] = []
        out: dict[str, str] = {}
        for rank in order:
            rec = ranks[rank].record
            if rec is None or rec.ended:
                continue
            if self._dumps_here(rec):
                local.append(KillTarget(rank=rank, pid=rec.pid))
            else:
                out[str(rank)] = f"on node {rec.node_rank} (dumped there before the kill)"
        policy = DumpPolicy.from_config(self.cfg)
        dumps = dump_stacks_of(
            self.run_dir, local, policy, culprit=culprit, owner=self.workers, on_culprit=on_culprit
        )
        for res in dumps:
            refused = res.error == NOT_A_WORKER
            out[str(res.rank)] = res.path or (f"refused: {res.error}" if refused else "failed")
            if res.path is None:
                errors[str(res.rank)] = res.error or "dump failed"
        return {k: out[k] for k in sorted(out, key=lambda r: (int(r) != culprit, int(r)))}

    # ---- after the finding is written ------------------------------------------------

    def after_write(self, finding: Finding) -> None:
        """Act on the finding; if that fails, the next fault is acted on again."""
        if self._acted_early is finding:
            self._acted_early = None  # killed once its stacks were written
            return
        try:
            self._act(finding)
        except Exception:
            self.action_errors += 1
            with self._lock:
                self._busy = False
            raise  # logged and counted by the monitor (sink_errors)

    def _act(self, finding: Finding) -> None:
        action = finding.action
        if action not in ("restart", "abort"):
            return
        self.actions_taken += 1
        rank = finding.rank
        cause = finding.to_dict()
        if finding.finding_type is FindingType.PROCESS_EXITED:
            # The agent already sees the failed workers and names the root cause from
            # their exit codes and error files (a rank killed by a signal before its
            # peers' errors); the monitor, seeing several exits in one scan, cannot order
            # them. So the agent's failure report is the restart's cause.
            reason = f"{action} after {finding.finding_type.value} on rank {rank}"
            if action == "abort":
                self.agent.set_cause(cause, abort=True)
            self.monitor.note_restart(reason)
            self._armed(cause if action == "abort" else None, reason)
            return
        reason = f"{action} after {finding.finding_type.value} on rank {rank}"
        pending, self._pending = self._pending, None
        if pending is not None:  # set before the dumps: the same object, now complete
            pending.update(cause)
            cause = pending
        else:
            self.agent.set_cause(cause, abort=action == "abort")
        self.monitor.note_restart(reason)
        try:
            killed = self._kill(rank, action)
        except Exception:
            self._withdraw(cause, reason)
            raise
        if not killed:
            self._withdraw(cause, reason)
        else:
            self._armed(cause, reason)

    def _armed(self, cause: JsonObject | None, reason: str) -> None:
        """The action is taken: from now the agent has ``busy_grace_s`` to see its group
        fail, else the busy state ends (and ``cause`` and the restart notice with it)."""
        with self._lock:
            if self._busy:
                self._acted_at = self.clock()
                self._undo = (cause, reason)

    def _kill(self, rank: int, action: str) -> bool:
        """SIGKILL the culprit (here, or through its node's relay); False if it was not
        (refused, or nobody can reach it)."""
        state = self.monitor.rules.ranks.get(rank)
        rec = state.record if state else None
        if rec is None:
            logger.error("rankguard: rank %d has no process to kill", rank)
            return False
        pid = rec.pid
        if self._dumps_here(rec):
            logger.warning("rankguard: %s: killing rank %d (pid %d)", action, rank, pid)
            if not kill_marked([KillTarget(rank=rank, pid=pid, kill=True)], owner=self.workers):
                if not pid_running(pid):
                    return True  # already gone (it died while its stacks were dumped)
                logger.error("rankguard: rank %d (pid %d) was not killed", rank, pid)
                return False
            self._killed = (rank, pid)
            return True
        if self.remote_kill is not None:
            node = rec.node_rank or 0
            others: list[JsonObject] = [
                {"rank": r, "pid": s.record.pid}
                for r, s in self.monitor.rules.ranks.items()
                if r != rank and s.record is not None and s.record.node_rank == node
            ]
            self.remote_kill(node, [{"rank": rank, "pid": pid, "kill": True}, *others])
            return True  # the relay checks and kills (or refuses and logs it there)
        logger.error("rankguard: cannot reach node of rank %d to kill it", rank)
        return False

    def _withdraw(self, cause: JsonObject, reason: str) -> None:
        """The kill did not happen: no restart is under way because of it."""
        logger.error("rankguard: %s did not happen: the next fault is acted on again", reason)
        self.agent.withdraw_cause(cause)
        self.monitor.rules.cancel_restart(reason)
        with self._lock:
            self._busy = False
            self._acted_at = None
            self._undo = None
