"""The agent's side of live recovery: watch the workers itself, hand a lost rank to a
standby instead of restarting the group.

With standbys (``--standby-ranks K``) :class:`~rankguard.launcher.agent.RankguardAgent`'s
worker-monitoring hook (``_monitor_workers``) asks :meth:`LiveRecovery.poll` instead of
torch elastic's own poll, which ends every worker as soon as one fails. Each poll looks
at every worker process of the node once (``Popen.poll``):

- a training rank ended with a non-zero status: :func:`~rankguard.live.plan.decide`
  says whether a standby takes its place (the script declared its state, a standby
  waits, no Python error escaped, the launcher is not stopping). If so, the lost rank
  is marked ``replacing`` and the standby gets its assignment in the workers' store
  (:mod:`rankguard.live.keys`), the group stays HEALTHY for torch elastic and one
  console line says it. If not, one line says why and the poll reports the group
  FAILED with that failure: torch elastic's group restart of today.
- with ``inprocess_restart.shrink_when_no_standby`` (said by the ranks with their
  state) and no standby waiting: the lost rank is dropped (``dropped`` in the store,
  the survivors go on renumbered), and a refill that reaches its wait later takes it
  back (:meth:`LiveRecovery._grow`): one line each.
- a standby ended before it was needed: one line, one standby fewer; not a failure.
- every training rank ended with 0: SUCCEEDED once the standbys have left (they leave
  when the ranks write ``finished``; one still starting, not yet at its wait, is ended
  at once; one at its wait after ``STANDBY_LEAVE_S`` if it did not leave).

Each recovery is one ``restarts.jsonl`` line of kind ``live_recovery``
(:meth:`LiveRecovery.entries_due`), written once the newcomer completed its first step
(``resumed_t``) or ``RESUMED_WAIT_S`` after the fault without it.

Several nodes (:mod:`rankguard.live.nodes`): each node publishes its view (standbys waiting, the
ranks it holds) every ``VIEW_EVERY_S``; node 0 takes a node whose launcher went silent
and whose ranks the survivors wait for as lost and, when the other nodes' standbys are
enough, gives its ranks to them (``take/<node>``, checked here at each poll); the node
map is by global rank (a node may hold another node's ranks). Every node's recoveries
reach node 0 through the store (``entry/<node>/<i>``): its ``restarts.jsonl``, the lost
ranks' findings and ``status.json["live"]`` are the job's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from rankguard.launcher.live_forked import ForkedWorkers, forked_view
from rankguard.live.keys import DROPPED, REPLACING, LiveKeys
from rankguard.live.nodes import NODE_SILENT_S, NodeWatch
from rankguard.live.plan import (
    SHRINK_YES,
    Assignment,
    Claim,
    Ended,
    Resumed,
    decide,
    ended_how,
)
from rankguard.schema.findings import FindingType, Reason
from rankguard.schema.restarts import LiveBlock, LiveReplacement, LostRank, RestartEntry

__all__ = ["RESUMED_WAIT_S", "STANDBY_LEAVE_S", "LiveRecovery"]

logger = logging.getLogger(__name__)

RESUMED_WAIT_S = 120.0
"""A recovery's line is written without ``resumed_t`` when the newcomer has completed
no step this long after the fault."""
STANDBY_LEAVE_S = 10.0
"""The standbys still running this long after the training ranks completed are ended."""
_STORE_TIMEOUT_S = 10.0
_READY_EVERY_S = 0.1  # how often a refilled standby still starting is looked for
TELL_WAIT_S = 30.0
"""At the end of a group, how long the lost ranks' findings still on their way to the
monitor are waited for (a scan writing a hang's stack dumps holds it that long at most)."""


class LiveRecovery:
    """One node's standbys and the ranks they replaced (see the module doc)."""

    def __init__(
        self,
        *,
        run_id: str,
        nproc: int,
        standbys: int,
        say: Callable[[str], None],
        on_lost: Callable[[LostRank], None] | None = None,
        store_factory: Callable[[str, int], Any] | None = None,
        on_started: Callable[[int], None] | None = None,
        start: Callable[..., Any] | None = None,
        refills: int | None = None,
        on_node_lost: Callable[[int], None] | None = None,
        node_silent_s: float = NODE_SILENT_S,
    ) -> None:
        self.run_id, self.nproc, self.standbys = run_id, nproc, standbys
        self.say = say
        self.on_lost = on_lost
        self._store_factory = store_factory or _store_client
        self.on_started = on_started  # a refilled standby's pid: one of the node's workers
        self.on_node_lost = on_node_lost  # node 0: a node whose ranks were taken over
        self.node_silent_s = node_silent_s  # a node's launcher silent this long: lost
        self._start = start or _start_process
        self.started_count = 0  # standbys started to refill used ones (the run)
        self.refills = refills  # how many may be started over the run (None: no limit)
        self.refilled = 0  # started over the run (every group)
        self.keys = LiveKeys(run_id, 0)
        self.node = 0
        self.holders: dict[int, int] = {}  # training rank (global) -> slot holding it
        self.waiting: list[int] = []  # standby slots not used yet, in order of use
        self.ended: set[int] = set()  # slots seen ended
        self.completed: set[int] = set()  # training ranks (global) ended with 0
        self.replaced: list[dict[str, Any]] = []  # every recovery of the run
        self.shrunk: list[dict[str, Any]] = []  # ranks dropped with no standby left (run)
        self.dropped: list[tuple[int, int]] = []  # (rank, lost pid) not given back yet
        self.left_unused = 0  # standbys that ended without taking a rank (this group)
        self._pending: list[dict[str, Any]] = []  # lines waiting for resumed_t
        self._store: Any = None
        self._addr: tuple[str, int] | None = None
        self._done_at: float | None = None
        self.stopping: str | None = None  # why no recovery now (the launcher stops)
        self._telling: list[threading.Thread] = []  # lost ranks' findings on their way
        self.nodes = NodeWatch(self.keys, 0, 1)  # several nodes: views, takeovers
        self.node_lost = False  # a node of the job was taken over (its agent gone)
        self._told_lost: set[int] = set()  # node 0: the taken-over nodes told on
        self._forked: ForkedWorkers | None = None  # --preload: the forked workers' view
        self._starting: dict[int, float] = {}  # refilled standby pid -> its start (monotonic)
        self._ready_seen_at = 0.0
        self.ready_s: list[float] = []  # refilled standbys: start -> waiting (s)
        self._handlers: dict[int, Any] | None = None  # the last poll's worker processes

    # ---- lifecycle ------------------------------------------------------------------

    def started(self, worker_group: Any, attempt: int) -> None:
        """A new worker group (the first, or after a group restart)."""
        self.keys = LiveKeys(self.run_id, attempt)
        self.node = int(worker_group.group_rank or 0)
        self.nodes = NodeWatch(
            self.keys,
            self.node,
            _nnodes(worker_group),
            hostname=socket.gethostname(),
            silent_s=self.node_silent_s,
        )
        self.node_lost = False
        self._told_lost = set()
        first = self.node * self.nproc
        self.holders = {first + lr: lr for lr in range(self.nproc)}
        self.waiting = [self.nproc + j for j in range(self.standbys)]
        self.ended, self.completed = set(), set()
        self.left_unused = 0
        self._done_at = None
        self._forked, self._starting = None, {}
        self.dropped = []
        self._store = None
        self._addr = (str(worker_group.master_addr), int(worker_group.master_port))

    def status(self) -> LiveBlock:
        """``status.json["live"]``: this node's standbys (waiting now, left without
        being needed: at the end of a run, or ended early) and the ranks they replaced."""
        return LiveBlock(
            standbys_per_node=self.standbys,
            waiting=len(self.waiting),
            left_unused=self.left_unused,
            used=len(self.replaced),
            started=self.started_count,
            replaced=tuple(_replacement(r) for r in self.replaced),
            shrunk=tuple(_replacement(r) for r in self.shrunk),
            world_size=len(self.holders) if self.shrunk else None,
        )

    def would_replace(self, rank: int) -> bool:
        """Whether a standby would take ``rank``'s place were its process to end now: a
        rank of this node, a standby waiting, the script's state declared, the launcher
        not stopping. Fault tolerance asks it (the monitor's thread, with a store client
        of its own) before it ends a hung rank: the others then keep running, and their
        stacks need not be written before the kill."""
        if rank not in self.holders or not self.waiting or self.stopping is not None:
            return False
        if self._addr is None:
            return False
        try:
            return bool(self._store_factory(*self._addr).check([self.keys.declared]))
        except Exception as exc:  # not known: as without live recovery
            logger.debug("rankguard: live recovery: the workers' store: %s", exc)
            return False

    # ---- the poll -------------------------------------------------------------------

    def poll(self, worker_group: Any, pcontext: Any) -> RunResult:
        # ranks forked by --preload's fork server: seen one process per slot as well
        pcontext = forked_view(pcontext, self._forked)
        if isinstance(pcontext, ForkedWorkers):
            self._forked = pcontext
        handlers: dict[int, Any] = pcontext.subprocess_handlers
        self._handlers = handlers
        lost: list[Ended] = []
        for slot in sorted(handlers):
            if slot in self.ended:
                continue
            proc = handlers[slot].proc
            code = proc.poll()
            if code is None:
                continue
            self.ended.add(slot)
            rank = self._held_by(slot)
            if rank is None:
                self._standby_ended(slot, proc.pid, code)
            elif code == 0:
                self.completed.add(rank)
            else:
                path = pcontext.error_files.get(slot, "")
                lost.append(Ended(slot, rank, proc.pid, code, bool(path) and os.path.isfile(path)))
        if lost:
            failed = self._recover(lost, handlers, pcontext)
            if failed is not None:
                return failed
        if len(self.completed) == len(self.holders):
            result = self._finishing(handlers, worker_group)
            if result.state == WorkerState.SUCCEEDED and isinstance(pcontext, ForkedWorkers):
                pcontext.release()  # the forked workers wait to be let go
            return result
        if self.nodes.several:
            self._across_nodes(handlers)
        if self._starting:
            self._watch_ready()
        return RunResult(state=WorkerState.HEALTHY)

    def _watch_ready(self) -> None:
        """A refilled standby at its wait: said once, with how long its start took
        (the time until a later loss of this node can be recovered live again)."""
        now = time.monotonic()
        if now - self._ready_seen_at < _READY_EVERY_S:
            return
        self._ready_seen_at = now
        try:
            store = self._client()
            ready = [p for p in self._starting if store.check([self.keys.waiting(p)])]
        except Exception as exc:  # the next look tries again
            logger.debug("rankguard: live recovery: the workers' store: %s", exc)
            return
        for pid in ready:
            took = now - self._starting.pop(pid)
            self.ready_s.append(took)
            self.say(f"live recovery: new standby pid {pid} ready ({took:.2f} s after its start)")
            if self.dropped:  # the job shrank meanwhile: it grows back
                try:
                    self._grow(pid)
                except Exception as exc:  # the store: the job stays shrunk
                    logger.warning("rankguard: live recovery: no grow back: %s", exc)

    def _held_by(self, slot: int) -> int | None:
        for rank, holder in self.holders.items():
            if holder == slot:
                return rank
        return None

    # ---- several nodes ----------------------------------------------------------------

    def _across_nodes(self, handlers: dict[int, Any]) -> None:
        """This node's view published; node 0's decision on lost nodes and the other
        nodes' recoveries; the lost ranks node 0 gave this node's standbys taken. A
        store that does not answer is logged: the next poll tries again."""
        try:
            store = self._client()
            held = self.holders.items()
            ranks = {r: handlers[s].proc.pid for r, s in held if s not in self.ended}
            self.nodes.publish(store, waiting=len(self.waiting), ranks=ranks)
            for line in self.nodes.decide(
                store,
                declared=lambda: bool(store.check([self.keys.declared])),
                stopping=self.stopping,
            ):
                self.say(line)
            for lost in sorted(set(self.nodes.takeovers) - self._told_lost):
                self._told_lost.add(lost)
                self.node_lost = True
                if self.on_node_lost is not None:
                    self.on_node_lost(lost)
            for claim in self.nodes.claims(store):
                self._adopt(claim, handlers)
            if self.node == 0:
                for entry in self.nodes.collect(store):
                    self._collected(entry)
        except Exception as exc:
            logger.warning("rankguard: live recovery across nodes: the workers' store: %s", exc)

    def _adopt(self, claim: Claim, handlers: dict[int, Any]) -> None:
        """A lost node's rank given to a standby of this node: it keeps its own slot
        (``LOCAL_RANK``, its device) and takes the rank's number."""
        self.node_lost = True
        alive = [s for s in self.waiting if handlers[s].proc.poll() is None]
        if not alive:
            self.say(
                f"live recovery: node {claim.lost_node}'s rank {claim.rank} was given to this "
                "node, but no standby is left here: the survivors give up on it and the "
                "group restarts"
            )
            return
        slot = alive[0]
        standby_pid = handlers[slot].proc.pid
        got = Assignment(
            rank=claim.rank,
            local_rank=slot,
            lost_pid=claim.lost_pid,
            standby_pid=standby_pid,
            cause=FindingType.PROCESS_EXITED.value,
            fault_t=claim.fault_t,
        )
        self._client().set(self.keys.assign(standby_pid), got.to_json())
        self.holders[claim.rank] = slot
        self.waiting.remove(slot)
        how = f"node {claim.lost_node} lost"
        entry = self._entry(got, Reason.DIED, how, lost_node=claim.lost_node)
        entry["lost_hostname"] = claim.hostname
        entry["message"] = (
            f"node {claim.lost_node} lost with its launcher; standby pid {standby_pid} on "
            f"node {self.node} took rank {claim.rank}, the others re-entered in process"
        )
        self._record(entry, got, how, claim.hostname)
        self.say(
            f"live recovery: rank {claim.rank} of lost node {claim.lost_node} (pid "
            f"{claim.lost_pid}) is taken over by standby pid {standby_pid} of this node "
            f"(LOCAL_RANK {slot}); no group restart ({len(self.waiting)} standby(s) left "
            "on this node)"
        )

    def _collected(self, entry: dict[str, Any]) -> None:
        """Node 0: another node's recovery, written and told here (the job's)."""
        try:
            lost = LostRank(
                rank=int(entry["lost_rank"]),
                pid=int(entry["lost_pid"]),
                standby_pid=int(entry["standby_pid"]),
                node=int(entry.get("lost_node", entry["node"])),
                reason=str(entry["reason"]),
                exit=str(entry["exit"]),
                hostname=str(entry.get("lost_hostname") or ""),
            )
            float(entry["fault_t"])
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("rankguard: another node's live recovery record: %s", exc)
            return
        entry["restart"] = len(self.replaced) + 1
        self.replaced.append(entry)
        self._pending.append(entry)
        self._tell(lost)

    def _standby_ended(self, slot: int, pid: int, code: int) -> None:
        if slot in self.waiting:
            self.waiting.remove(slot)
            self.left_unused += 1
        if code != 0 and len(self.completed) < self.nproc:
            self.say(
                f"live recovery: standby pid {pid} ended ({ended_how(code)}) before it was "
                f"needed; {len(self.waiting)} standby(s) left on this node"
            )

    def _recover(
        self, lost: list[Ended], handlers: dict[int, Any], pcontext: Any
    ) -> RunResult | None:
        """Replace ``lost`` by standbys; the FAILED result when that cannot be done."""
        if self._taken_over(lost):
            return None
        alive = [s for s in self.waiting if handlers[s].proc.poll() is None]
        try:
            declared = bool(self._client().check([self.keys.declared]))
        except Exception as exc:
            declared = False
            self.stopping = self.stopping or f"the workers' store did not answer ({exc})"
        shrink = self._shrink(declared)
        if shrink == SHRINK_YES and self._starting:
            # a refill still starting is not waited for: the job shrinks now and grows
            # back once it is at its wait (_watch_ready)
            starting = {handlers[s].proc.pid for s in alive} & set(self._starting)
            alive = [s for s in alive if handlers[s].proc.pid not in starting]
        decision = decide(
            lost,
            alive,
            declared=declared,
            stopping=self.stopping,
            shrink=shrink,
            world=len(self.holders),
        )
        if decision.restart is None:
            try:
                for ended, slot in decision.pairs:
                    self._replace(ended, slot, handlers[slot].proc.pid)
                if decision.dropped:
                    self._drop(decision.dropped)
                for ended, slot in decision.pairs:
                    self._refill(ended, slot, pcontext)
                return None
            except Exception as exc:  # the store: the group restart of today
                decision = decide(lost, [], declared=True, stopping=f"the store failed ({exc})")
        self.say(f"live recovery cannot apply: {decision.restart}: the worker group restarts")
        failures = {
            e.rank: _failure(e, pcontext.error_files.get(e.local_rank, ""))
            for e in lost
            if e.rank is not None
        }
        return RunResult(state=WorkerState.FAILED, failures=failures)

    def _shrink(self, declared: bool) -> str | None:
        """Whether a lost rank with no standby left may be dropped (the job goes on with
        fewer ranks): ``SHRINK_YES``, why not, or None where the ranks did not ask for
        it (``inprocess_restart.shrink_when_no_standby``, said with their state)."""
        if not declared:
            return None
        try:
            asked = bool(self._client().check([self.keys.shrink]))
        except Exception:
            return None
        if not asked:
            return None
        if self.nodes.several:
            return "the job runs on several nodes (a shrink is one node's)"
        return SHRINK_YES

    def _drop(self, lost: list[Ended]) -> None:
        """No standby left: the job goes on without ``lost`` in process. Each is marked
        ``dropped`` in the workers' store (the survivors form the next round without
        it, renumbered in order), leaves this node's map, and gets its line."""
        before = sorted(self.holders)
        store = self._client()
        for ended in lost:
            assert ended.rank is not None
            store.set(self.keys.lost(ended.rank), f"{DROPPED} {ended.pid}")
            self.holders.pop(ended.rank, None)
            self.dropped.append((ended.rank, ended.pid))
        after = sorted(self.holders)
        moved = ", ".join(f"{old}->{new}" for new, old in enumerate(after) if old != new)
        for ended in lost:
            assert ended.rank is not None
            how = ended_how(ended.exit_code)
            got = Assignment(
                rank=ended.rank,
                local_rank=ended.local_rank,
                lost_pid=ended.pid,
                standby_pid=0,
                cause=FindingType.PROCESS_EXITED.value,
                fault_t=time.time(),
            )
            reason = Reason.DIED if ended.exit_code < 0 else Reason.EXITED_WITH_ERROR
            entry = self._entry(got, reason, how)
            entry.update(
                shrink=True,
                standby_pid=None,
                world_size=len(after),
                world_size_before=len(before),
                renumbered={str(old): new for new, old in enumerate(after) if old != new},
                restart=len(self.replaced) + len(self.shrunk) + 1,
                message=f"process ended ({how}) with no standby left; the job goes on "
                f"with {len(after)} of {len(before)} rank(s) in process",
            )
            self.shrunk.append(entry)
            self._pending.append(entry)
            self._tell(
                LostRank(
                    rank=got.rank,
                    pid=got.lost_pid,
                    standby_pid=0,
                    node=self.node,
                    reason=reason.value,
                    exit=how,
                    hostname=socket.gethostname(),
                )
            )
        names = ", ".join(f"rank {e.rank} (pid {e.pid}, {ended_how(e.exit_code)})" for e in lost)
        self.say(
            f"live recovery: {names} lost and no standby left on this node: the job goes "
            f"on with {len(after)} of {len(before)} rank(s) in process "
            f"(inprocess_restart.shrink_when_no_standby; renumbered: {moved or 'none'}); "
            "no group restart"
        )

    def _grow(self, pid: int) -> None:
        """A standby reached its wait after the job shrank: it takes the first dropped
        rank (its number, its ``LOCAL_RANK``); the survivors' round ends (the standby
        ends it) and the next one has the rank again, its state from a survivor."""
        slot = next((s for s in self.waiting if self._pid_of(s) == pid), None)
        if slot is None:
            return
        rank, lost_pid = self.dropped[0]
        got = Assignment(
            rank=rank,
            local_rank=rank - self.node * self.nproc,
            lost_pid=lost_pid,
            standby_pid=pid,
            cause=FindingType.PROCESS_EXITED.value,
            fault_t=time.time(),
        )
        store = self._client()
        store.set(self.keys.lost(rank), REPLACING)
        store.set(self.keys.assign(pid), got.to_json())
        self.dropped.pop(0)
        before = len(self.holders)
        self.holders[rank] = slot
        self.waiting.remove(slot)
        entry = self._entry(got, Reason.DIED, "dropped")
        entry.update(
            grow=True,
            world_size=len(self.holders),
            world_size_before=before,
            message=f"standby pid {pid} took dropped rank {rank}; the job grew back to "
            f"{len(self.holders)} rank(s) in process",
        )
        self.replaced.append(entry)
        self._pending.append(entry)
        self.say(
            f"live recovery: standby pid {pid} takes dropped rank {rank}: the job grows back "
            f"to {len(self.holders)} rank(s) in process; no group restart "
            f"({len(self.waiting)} standby(s) left on this node)"
        )

    def _pid_of(self, slot: int) -> int | None:
        handlers = self._handlers
        if handlers is None or slot not in handlers:
            return None
        return int(handlers[slot].proc.pid)

    def _taken_over(self, lost: list[Ended]) -> bool:
        """Node 0 took this node for lost (its launcher was silent) and gave its ranks
        to other nodes' standbys: the ranks ending now are theirs, not this node's."""
        if not self.nodes.several:
            return False
        try:
            taken = self.nodes.taken_over(self._client())
        except Exception:
            return False
        if taken:
            for ended in lost:
                self.holders.pop(ended.rank or -1, None)
            self.say(
                f"live recovery: rank(s) {', '.join(str(e.rank) for e in lost)} ended, but "
                f"node 0 took this node for lost and gave its ranks to other nodes' standbys"
            )
        return taken

    def _replace(self, ended: Ended, slot: int, standby_pid: int) -> None:
        assert ended.rank is not None
        local = ended.rank - self.node * self.nproc
        if not 0 <= local < self.nproc:  # a lost node's rank this node took: own slot
            local = slot
        reason = Reason.DIED if ended.exit_code < 0 else Reason.EXITED_WITH_ERROR
        got = Assignment(
            rank=ended.rank,
            local_rank=local,
            lost_pid=ended.pid,
            standby_pid=standby_pid,
            cause=FindingType.PROCESS_EXITED.value,
            fault_t=time.time(),
        )
        store = self._client()
        store.set(self.keys.lost(ended.rank), REPLACING)
        store.set(self.keys.assign(standby_pid), got.to_json())
        self.holders[ended.rank] = slot
        self.waiting.remove(slot)
        how = ended_how(ended.exit_code)
        entry = self._entry(got, reason, how)
        entry["message"] = (
            f"process ended ({how}); standby pid {standby_pid} took rank {ended.rank}, the "
            "others re-entered in process"
        )
        self._record(entry, got, how, socket.gethostname())
        self.say(
            f"live recovery: rank {ended.rank} (pid {ended.pid}, {how}) "
            f"is taken over by standby pid {standby_pid}; no group restart "
            f"({len(self.waiting)} standby(s) left on this node)"
        )

    def _entry(
        self, got: Assignment, reason: Reason, how: str, *, lost_node: int | None = None
    ) -> dict[str, Any]:
        """A recovery's ``restarts.jsonl`` line, its cost still unknown."""
        return {
            "schema_version": 1,
            "kind": "live_recovery",
            "run_id": self.run_id,
            "restart": len(self.replaced) + len(self.shrunk) + 1,
            "rank": got.rank,
            "lost_rank": got.rank,
            "lost_pid": got.lost_pid,
            "standby_pid": got.standby_pid,
            "node": self.node,
            "lost_node": self.node if lost_node is None else lost_node,
            "cause": got.cause,
            "reason": reason.value,
            "exit": how,
            "fault_t": round(got.fault_t, 3),
            "resumed_t": None,
            "recovery_s": None,
            "steps_redone": None,
            "message": "",
        }

    def _record(self, entry: dict[str, Any], got: Assignment, how: str, hostname: str) -> None:
        """Keep the recovery's line; node 0 tells the finding naming the lost rank,
        another node hands both to node 0 through the store."""
        self.replaced.append(entry)
        if self.node != 0 and self.nodes.several:
            try:
                self.nodes.publish_entry(self._client(), entry)
            except Exception as exc:  # said on this node's console only, as before
                logger.warning("rankguard: live recovery: not published to node 0: %s", exc)
            self._pending.append(entry)  # this node's console line, once resumed
            return
        self._pending.append(entry)
        self._tell(
            LostRank(
                rank=got.rank,
                pid=got.lost_pid,
                standby_pid=got.standby_pid,
                node=int(entry["lost_node"]),
                reason=str(entry["reason"]),
                exit=how,
                hostname=hostname,
            )
        )

    def _tell(self, lost: LostRank) -> None:
        if self.on_lost is None:  # the finding naming the lost rank
            return
        # in a thread: the monitor's scan may be writing a hang's finding (its stack
        # dumps, seconds) and the watch of the workers must not wait for it
        told = threading.Thread(
            target=self._tell_lost, args=(lost,), name="rankguard-live-lost", daemon=True
        )
        self._telling.append(told)
        told.start()

    def _tell_lost(self, lost: LostRank) -> None:
        assert self.on_lost is not None
        try:
            self.on_lost(lost)
        except Exception:
            logger.exception("rankguard: the lost rank's finding failed")

    def wait_told(self, timeout_s: float = TELL_WAIT_S) -> None:
        """The lost ranks' findings handed on (each in a thread of its own)."""
        deadline = time.monotonic() + timeout_s
        for told in self._telling:
            told.join(max(0.0, deadline - time.monotonic()))
        self._telling = [t for t in self._telling if t.is_alive()]

    def _refill(self, ended: Ended, used: int, pcontext: Any) -> None:
        """Start a new standby in the lost process's slot, the way the used one started
        (its command line and environment: a standby of this node, warm once it reaches
        the wrapper), so that a later loss is recovered live too. A start that fails is
        said; the node has one standby fewer."""
        if self.refills is not None and self.refilled >= self.refills:
            return
        slot = ended.local_rank
        self.refilled += 1
        try:
            env = dict(pcontext.envs[used])
            error_file = pcontext.error_files.get(slot, "")
            if error_file:
                env["TORCHELASTIC_ERROR_FILE"] = error_file
            # forked workers (--preload): forked from the same fork server as the others
            start = pcontext.start if isinstance(pcontext, ForkedWorkers) else self._start
            handler = start(
                entrypoint=pcontext.entrypoint,
                args=pcontext.args[used],
                env=env,
                stdout=_refill_log(pcontext.stdouts.get(slot, ""), self.started_count + 1),
                stderr=_refill_log(pcontext.stderrs.get(slot, ""), self.started_count + 1),
                local_rank_id=slot,
            )
        except Exception as exc:
            self.say(f"live recovery: no new standby started ({exc}); {self._standbys_said()}")
            return
        pcontext.subprocess_handlers[slot] = handler
        # the slot now runs a standby: a later refill started "as the used one" from this
        # slot must get a standby's environment, not the training rank's it held first
        pcontext.envs[slot] = env
        pcontext.args[slot] = pcontext.args[used]
        self.ended.discard(slot)
        self.waiting.append(slot)
        self.started_count += 1
        self._starting[handler.proc.pid] = time.monotonic()
        if self.on_started is not None:
            self.on_started(handler.proc.pid)
        self.say(
            f"live recovery: new standby pid {handler.proc.pid} started in place of rank "
            f"{ended.rank}'s lost process; {self._standbys_said()}"
        )

    def _standbys_said(self) -> str:
        return (
            f"standbys on this node: {len(self.waiting)} waiting, {len(self.replaced)} used, "
            f"{self.started_count} started to refill"
        )

    def _finishing(self, handlers: dict[int, Any], worker_group: Any) -> RunResult:
        """Every training rank completed: SUCCEEDED once the standbys are gone."""
        now = time.monotonic()
        left = [s for s in handlers if s not in self.ended and handlers[s].proc.poll() is None]
        if self._done_at is None:
            self._done_at = now
            self._end_starting(handlers, left)
            self._lost_nodes_at_end()
        if left and now - self._done_at < STANDBY_LEAVE_S:
            return RunResult(state=WorkerState.HEALTHY)
        for slot in left:
            logger.warning(
                "rankguard: standby pid %d did not leave: ended", handlers[slot].proc.pid
            )
            with contextlib.suppress(OSError):
                handlers[slot].proc.send_signal(signal.SIGKILL)
        # every worker's, standbys included, by torch elastic's own number (its events)
        values: dict[int, Any] = {w.global_rank: None for w in worker_group.workers}
        return RunResult(state=WorkerState.SUCCEEDED, return_values=values)

    def _lost_nodes_at_end(self) -> None:
        """Several nodes: this node's last view (no training rank left: its launcher,
        gone to torch elastic's exit barrier, is not a lost node), whether a node was
        taken over (that exit barrier then waits for its agent in vain: the agent
        shortens it), and node 0's last look at the other nodes' recoveries."""
        if not self.nodes.several:
            return
        try:
            store = self._client()
            self.nodes.publish(store, waiting=0, ranks={}, now=True)  # no rank to lose
            self.node_lost = self.node_lost or self.nodes.any_taken(store)
            if self.node == 0:
                for entry in self.nodes.collect(store, now=True):
                    self._collected(entry)
        except Exception as exc:
            logger.debug("rankguard: live recovery: the workers' store at the end: %s", exc)

    def _end_starting(self, handlers: dict[int, Any], left: list[int]) -> None:
        """The standbys not yet at their wait (a refill still importing torch) are ended
        now: they hold nothing, and would read ``finished`` only once started (seconds).
        Where the store does not answer, each gets ``STANDBY_LEAVE_S`` to leave."""
        try:
            store = self._client()
            starting = [
                s for s in left if not store.check([self.keys.waiting(handlers[s].proc.pid)])
            ]
        except Exception:
            return
        for slot in starting:
            logger.info(
                "rankguard: standby pid %d ended: the training ranks completed while it "
                "was still starting",
                handlers[slot].proc.pid,
            )
            with contextlib.suppress(OSError):
                handlers[slot].proc.send_signal(signal.SIGTERM)

    # ---- the recoveries' lines ---------------------------------------------------------

    def entries_due(self, *, final: bool = False) -> list[RestartEntry]:
        """The recoveries whose line can be written now: the newcomer's first completed
        step is known, or it is late (``final``: every one left, the run ends)."""
        if final:
            self.wait_told()
        out = []
        for entry in list(self._pending):
            shrink = bool(entry.get("shrink"))  # the first step of the smaller world
            resumed = self._resumed(int(entry["lost_pid" if shrink else "standby_pid"]))
            if resumed is not None:
                entry["resumed_t"] = round(resumed.t, 3)
                entry["recovery_s"] = round(max(0.0, resumed.t - entry["fault_t"]), 3)
                entry["steps_redone"] = resumed.steps_redone
                entry["resumed_step"] = resumed.step
                if resumed.source is not None:  # a replica on a live rank, or a checkpoint
                    entry["source"] = resumed.source
                    said = f"state from {resumed.source}"
                    entry["message"] = f"{entry['message']}; {said}" if entry["message"] else said
            elif not final and time.time() - entry["fault_t"] < RESUMED_WAIT_S:
                continue
            self._pending.remove(entry)
            line = RestartEntry.from_dict(entry)
            assert line is not None
            out.append(line)
        return out

    def _resumed(self, pid: int) -> Resumed | None:
        try:
            store = self._client()
            key = self.keys.resumed(pid)
            if not store.check([key]):
                return None
            return Resumed.from_json(store.get(key))
        except Exception as exc:  # not known (the store is gone at the end): said as such
            logger.debug("rankguard: live recovery: no resumed record for pid %d: %s", pid, exc)
            return None

    def _client(self) -> Any:
        if self._store is None:
            if self._addr is None:
                raise RuntimeError("no worker group")
            self._store = self._store_factory(*self._addr)
        return self._store


def _replacement(r: dict[str, Any]) -> LiveReplacement:
    """A recovery's entry in ``status.json["live"]``."""
    return LiveReplacement(
        lost_rank=r["lost_rank"],
        lost_pid=r["lost_pid"],
        standby_pid=r["standby_pid"],
        cause=r["cause"],
        fault_t=r["fault_t"],
        recovery_s=r["recovery_s"],
        steps_redone=r["steps_redone"],
        source=r.get("source"),
    )


def _failure(ended: Ended, error_file: str) -> ProcessFailure:
    """torch elastic's failure record; an error file cut short by the kill (not JSON) is
    dropped first, as the agent does with torch's own poll (the exit code names it)."""
    try:
        return ProcessFailure(ended.local_rank, ended.pid, ended.exit_code, error_file)
    except ValueError:
        with contextlib.suppress(OSError):
            os.unlink(error_file)
        logger.warning("rankguard: torn worker error file dropped: %s", error_file)
        return ProcessFailure(ended.local_rank, ended.pid, ended.exit_code, error_file)


def _nnodes(worker_group: Any) -> int:
    """The nodes of the round (torch elastic's world of workers over this node's)."""
    workers = list(getattr(worker_group, "workers", None) or [])
    world = getattr(workers[0], "world_size", None) if workers else None
    if not workers or not isinstance(world, int) or world <= 0:
        return 1
    return max(1, world // len(workers))


def _refill_log(path: str, n: int) -> str:
    """A refilled standby's log file beside the lost process's (torch elastic opens
    its files for writing: the lost process's log is kept); "" (not redirected) stays."""
    if not path:
        return ""
    root, ext = os.path.splitext(path)
    return f"{root}.standby{n}{ext}"


def _start_process(**kw: Any) -> Any:
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        get_subprocess_handler,
    )

    return get_subprocess_handler(**kw)


def _store_client(host: str, port: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=_STORE_TIMEOUT_S), use_libuv=True
    )
