"""Launcher side of preemption: forward the signal, agree on one step, wait, then kill.

Every node's launcher runs a :class:`PreemptionCoordinator` (a daemon thread). The
exit signal reaching any launcher (or any rank: the rank passes it to its launcher)
starts the preemption of the whole job:

1. The launcher's handler only records it (:meth:`PreemptionCoordinator.claims`, called
   by the agent's signal handler): torch elastic's own handler, which would terminate
   the workers at once, is not called for the exit signal.
2. The coordinator thread forwards the signal to this node's ranks (their flag-only
   handler) and starts this node's grace window, ``preempt_time`` long.
3. Node 0 chooses the stop step through :class:`rankguard.monitor.agree.StopAgreement` (reason
   ``preempted: ...``: ``control.json`` for every rank, the relays for other nodes) and
   sets the store key ``preempt``. Each signalled rank publishes a heartbeat at its next
   step boundary; once every rank's latest record says it got the signal, node 0 knows
   their current steps and needs a short lead only (``fresh_lead_s``: two monitor scans
   plus a second); after ``wait_fresh_s`` without that (other nodes' relays push every
   heartbeat interval; a rank that does not listen) it uses the agreement's default
   lead, which covers records one heartbeat interval old. A node k whose launcher got
   the signal first sets ``preempt/request/node/<k>`` for node 0 instead. Every node's
   coordinator watches ``preempt``, so a node that received nothing still forwards the
   signal, writes the stop step for its ranks and opens its grace window.
4. The agent (:class:`rankguard.launcher.agent.RankguardAgent`) then neither restarts
   the group nor counts the exits as failures, kills (SIGKILL) the ranks still running
   when the window closes, and the launcher exits ``EXIT_PREEMPTED``.

:class:`PreemptionEvaluator` (node 0's monitor) records the preemption and whether
every rank saved the stop step (each rank's heartbeat names its last completed save), or
that every rank finished training before it (the job completed: nothing to resume), in
``findings.jsonl`` and ``status.json`` (``preemption``) with the grace budget. The stop
step counts this run's training steps; the lines say it so, with the script's step where
the heartbeats tell it (:func:`rankguard.monitor.agree.stop_words`), and a saved step is
the script's.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankguard.monitor.agree import finished_before_stop, script_offset, stop_words, write_control
from rankguard.monitor.blockeval import BlockEvaluator
from rankguard.preempt.budget import GraceBudget
from rankguard.preempt.config import PreemptionConfig
from rankguard.schema.blocks import PreemptBlock, read_block
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.layout import StoreKeys
from rankguard.schema.statusblocks import PreemptionBlock
from rankguard.util.textsafe import safe_text
from rankguard.util.wakeup import Wakeup

if TYPE_CHECKING:
    from rankguard.ft.kill import OwnedWorkers
    from rankguard.monitor.rules import RankState
    from rankguard.schema.records import HeartbeatRecord

__all__ = ["PreemptionCoordinator", "PreemptionEvaluator"]

logger = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the coordinator looks at the store and its flags."""


class PreemptionCoordinator:
    def __init__(
        self,
        cfg: PreemptionConfig,
        *,
        node_rank: int,
        nnodes: int,
        run_id: str,
        run_dir: Path,
        workers: OwnedWorkers,
        store: Any = None,
        request_stop: Callable[[str, float | None], int | None] | None = None,
        ranks: Callable[[], Mapping[int, RankState]] | None = None,
        fresh_lead_s: float = 3.0,
        wait_fresh_s: float = 7.0,
        say: Callable[[str], None] = logger.warning,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.sig = cfg.signum
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.run_dir = Path(run_dir)
        self.workers = workers
        self.store = store
        self.keys = StoreKeys(run_id)
        self.request_stop = request_stop  # node 0 with a monitor: StopAgreement
        self.ranks = ranks  # node 0: the monitor's view of every rank
        self.fresh_lead_s = fresh_lead_s
        self.wait_fresh_s = wait_fresh_s
        self.say = say
        self.clock = clock
        # set by the signal handler (flags only)
        self.signalled_at: float | None = None
        self.signals = 0
        # set by the coordinator thread
        self.started_at: float | None = None  # this node's grace window opened
        self.reason: str | None = None
        self.stop_at: int | None = None
        self.terminated: list[int] = []  # pids killed when the window closed
        self.terminated_ranks: list[int] = []  # their global ranks
        self.wall_started: float | None = None
        self._published = False
        self.bad_values = 0  # store values that were not a preemption (logged, rate-limited)
        self._forwarded = False
        self._wake = Wakeup()  # set from the signal handler: no lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- the agent's side (signal handler, monitor loop) ----------------------------

    def claims(self, signum: int) -> bool:
        """From the launcher's signal handler: is ``signum`` the exit signal (then it
        is recorded, and nothing else stops the workers)? Sets flags only."""
        if signum != self.sig:
            return False
        self.signals += 1
        if self.signalled_at is None:
            self.signalled_at = self.clock()
        self._wake.set()
        return True

    @property
    def active(self) -> bool:
        """This node's grace window is open (or closed): the job is being preempted."""
        return self.started_at is not None

    def time_left(self) -> float | None:
        if self.started_at is None:
            return None
        return self.started_at + self.cfg.preempt_time - self.clock()

    def expired(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0

    def note_terminated(self, pids: list[int], ranks: list[int] | None = None) -> None:
        """The agent kills this node's ranks still running at the grace limit: ``pids``,
        ranks ``ranks`` (their global ranks)."""
        self.terminated = list(pids)
        self.terminated_ranks = list(ranks or [])
        who = f"rank(s) {_ranks(self.terminated_ranks)}, " if self.terminated_ranks else ""
        self.say(
            f"preemption: {len(pids)} rank(s) still running after preempt_time="
            f"{self.cfg.preempt_time:g}s were killed by rankguard at the grace limit "
            f"({who}pids {pids}); the last checkpoint every rank committed is what the next "
            "run resumes from"
        )

    def kill_reason(self) -> str:
        """Why the ranks still running end now (the monitor holds their exits as this
        stop's, not as failures)."""
        return (
            f"{signal.Signals(self.sig).name}: preempt_time={self.cfg.preempt_time:g}s ran "
            "out and rankguard killed the ranks still running at the grace limit"
        )

    # ---- thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rankguard-preempt", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            try:
                self.tick()
            except Exception:
                logger.exception("rankguard: preemption coordinator step failed")

    def tick(self) -> None:
        """One look at the flags and the store (the thread calls it every 0.1 s)."""
        with self._lock:
            if self.signalled_at is not None and self.started_at is None:
                name = signal.Signals(self.sig).name
                self._begin(f"preempted: node {self.node_rank}'s launcher received {name}")
                if self.node_rank != 0 and self.store is not None:
                    self.store.set(self.keys.preempt_request(self.node_rank), self.reason or "")
            elif self.signals > 1 and self.started_at is not None:
                self.signals = 1
                self.say(
                    f"preemption: {signal.Signals(self.sig).name} again: ignored, the save "
                    f"in progress goes on ({max(0.0, self.time_left() or 0):.0f}s of the "
                    "grace window left)"
                )
            if self.store is None or self.nnodes <= 1:
                if self.node_rank == 0 and self.started_at is not None:
                    self._agree()
                return
            if self.node_rank == 0:
                if self.started_at is None:
                    for node in range(1, self.nnodes):
                        key = self.keys.preempt_request(node)
                        if self.store.check([key]):
                            reason = self._request(node, self.store.get(key))
                            if reason is not None:
                                self._begin(reason)
                                break
                if self.started_at is not None:
                    self._agree()
            elif not self._published and self.store.check([self.keys.preempt]):
                payload = _preempt_payload(self.store.get(self.keys.preempt))
                if isinstance(payload, str):
                    self._bad_value(f"store key preempt ignored: {payload}")
                    return
                step, reason = payload
                if self.started_at is None:
                    self._begin(reason)
                if step is not None:
                    self.stop_at = step
                    write_control(self.run_dir, step, reason)
                self._published = True

    def _request(self, node: int, raw: Any) -> str | None:
        """Node 0: the reason of node ``node``'s preemption request, or None while it
        is not one: not a short text, or (with a monitor) not confirmed by any of that
        node's ranks saying in its heartbeat that it received the signal (its launcher
        forwards the signal before it asks; any client of the store can write the key)."""
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            text = None
        if text is None or len(text) > _MAX_REASON:
            self._bad_value(f"node {node}'s preemption request ignored: not a short text")
            return None
        if self.ranks is not None and not self._signalled(node):
            self._bad_value(
                f"node {node}'s preemption request not confirmed by its ranks' heartbeats "
                "(none says it received the signal): waiting"
            )
            return None
        return safe_text(text) or f"preempted by node {node}"

    def _signalled(self, node: int) -> bool:
        states = self.ranks() if self.ranks is not None else {}
        for st in states.values():
            rec = st.record
            if rec is None or getattr(rec, "node_rank", None) != node:
                continue
            pre = _preempt_block(rec)
            if pre is not None and pre.signal_received:
                return True
        return False

    def _bad_value(self, why: str) -> None:
        """A store value that cannot be used: logged once, then every 1000th time."""
        self.bad_values += 1
        if self.bad_values == 1 or self.bad_values % 1000 == 0:
            logger.warning("rankguard: preemption: %s (%d so far)", why, self.bad_values)

    def _begin(self, reason: str) -> None:
        """Open this node's grace window and pass the signal to its ranks."""
        self.started_at = self.clock()
        self.wall_started = time.time()
        self.reason = reason
        self.say(
            f"{reason}: every rank stops at one agreed step to save it; grace window "
            f"preempt_time={self.cfg.preempt_time:g}s, then the ranks left are killed"
        )
        self._forward()

    def _forward(self) -> None:
        if self._forwarded:
            return
        self._forwarded = True
        for pid in self.workers.pids():
            if self.workers.owns(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, self.sig)

    def _fresh(self) -> bool:
        """Every rank's latest record was written after it got the signal."""
        states = self.ranks() if self.ranks is not None else {}
        records = [s.record for s in states.values()]
        return bool(records) and all(
            rec is not None and (pre := _preempt_block(rec)) is not None and pre.signal_received
            for rec in records
        )

    def _agree(self) -> None:
        """Node 0: choose the stop step once (from fresh progress when it comes in
        time) and tell every node."""
        if self._published:
            return
        fresh = self._fresh()
        waited = self.clock() - (self.started_at or self.clock())
        if not fresh and waited < self.wait_fresh_s:
            return
        self._published = True
        reason = self.reason or "preempted"
        if self.request_stop is not None:
            self.stop_at = self.request_stop(reason, self.fresh_lead_s if fresh else None)
        if self.stop_at is None:
            self.say(
                "preemption: no monitor on node 0 (heartbeat.enabled=false): no stop step "
                "can be agreed, nothing is saved; the ranks are killed at the end of the "
                "grace window"
            )
        if self.store is not None and self.nnodes > 1:
            payload = {"stop_at_step": self.stop_at, "reason": reason}
            self.store.set(self.keys.preempt, json.dumps(payload))


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class PreemptionEvaluator(BlockEvaluator[PreemptBlock]):
    """Node 0's monitor: the preemption and what it saved in findings and status, and
    the grace budget (does the longest save fit ``preempt_time``?).

    A rank saved the stop step when its last record's ``preempt`` block says its last
    completed save covers exactly that many training steps (``saved_seq``); a clean
    exit at or past the step proves nothing (a script may stop without a save)."""

    name = "preemption"
    block = PreemptBlock

    def __init__(
        self,
        coordinator: PreemptionCoordinator,
        budget: GraceBudget,
        run_id: str,
    ) -> None:
        super().__init__()
        self.coordinator = coordinator
        self.budget = budget
        self.run_id = run_id
        self._announced = False
        self._decided = False  # the outcome's finding written (every rank ended)
        self._saved: int | None = None  # the script's step every rank saved at the stop
        self.script_step: int | None = None  # the stop step in the script's numbering
        self.finished = False  # every rank finished training before the stop step
        self._ranks_saved = 0
        self._world = 0
        self._last_saves: dict[int, int | None] = {}  # rank -> its last save's step
        self._warned_budget = False

    def on_block(
        self, rank: int, state: RankState, block: PreemptBlock, ranks: Mapping[int, RankState]
    ) -> list[Finding]:
        self.budget.observe(block.save_max_s)
        return []

    def after_blocks(self, now: float, ranks: Mapping[int, RankState]) -> list[Finding]:
        records = [s.record for s in ranks.values() if s.record is not None]
        if not self.budget.fits() and not self._warned_budget:
            self._warned_budget = True
            logger.warning("rankguard: %s", self.budget.warning())
        coord = self.coordinator
        out: list[Finding] = []
        step = coord.stop_at
        if step is not None and records:
            offset = script_offset(records)
            if offset is not None:  # the latest the heartbeats tell (a save's is exact)
                self.script_step = step + offset
        if coord.active and step is not None and not self._announced:
            self._announced = True
            out.append(
                Finding.build(
                    FindingType.PREEMPTED,
                    Reason.EXIT_SIGNAL,
                    run_id=self.run_id,
                    rank=-1,
                    message=f"{coord.reason}: every rank stops "
                    f"{stop_words(step, self.script_step)} to save it and exits "
                    f"(grace {coord.cfg.preempt_time:g}s)",
                    iteration=self.script_step,
                    timeout_s=coord.cfg.preempt_time,
                    detail=self._stop_detail(step) | {"signal": signal.Signals(coord.sig).name},
                )
            )
        if self._announced and not self._decided and step is not None and records:
            self._tally(step, ranks)
            if len(records) == len(ranks) and all(r.ended for r in records):
                self._decided = True
                out.append(self._outcome(step))
        return out

    def _tally(self, stop: int, ranks: Mapping[int, RankState]) -> None:
        """Each rank's last completed save (its step, the training steps it covers),
        from its latest record."""
        saves: dict[int, tuple[int, int] | None] = {}
        for rank, st in ranks.items():
            pre = _preempt_block(st.record) if st.record is not None else None
            if pre is None or pre.saved_step is None or pre.saved_seq is None:
                saves[rank] = None
            else:
                saves[rank] = (pre.saved_step, pre.saved_seq)
        at_stop = [s[0] for s in saves.values() if s is not None and s[1] == stop]
        self._world = len(saves)
        self._ranks_saved = len(at_stop)
        self._last_saves = {r: s[0] if s is not None else None for r, s in saves.items()}
        every = bool(saves) and len(at_stop) == len(saves) and len(set(at_stop)) == 1
        self._saved = at_stop[0] if every else None
        records = [st.record for st in ranks.values() if st.record is not None]
        self.finished = self._saved is None and finished_before_stop(records, len(ranks))

    def _stop_detail(self, stop: int) -> dict[str, Any]:
        """The stop step in both numberings, for a finding's detail."""
        return {"stop_after_steps": stop, "stop_script_step": self.script_step}

    def _outcome(self, stop: int) -> Finding:
        """Every rank ended: the finding that says whether they saved the stop step, or
        that they all finished training before it."""
        if self._saved is not None:
            return Finding.build(
                FindingType.PREEMPTED,
                Reason.PREEMPTION_SAVED,
                run_id=self.run_id,
                rank=-1,
                message=f"preempted: every rank ({self._ranks_saved}) saved script step "
                f"{self._saved} and exited; the next run resumes there",
                iteration=self._saved,
                detail=self._stop_detail(stop) | {"saved_step": self._saved},
            )
        if self.finished:
            return Finding.build(
                FindingType.PREEMPTED,
                Reason.PREEMPTION_AFTER_TRAINING,
                run_id=self.run_id,
                rank=-1,
                message=f"{self._finished_line(stop)}: the job completed, nothing to resume",
                iteration=self.script_step,
                detail=self._stop_detail(stop) | {"saved_step": None},
            )
        return Finding.build(
            FindingType.PREEMPTED,
            Reason.PREEMPTION_NOT_SAVED,
            run_id=self.run_id,
            rank=-1,
            message=f"preempted: {self._not_saved(stop)}",
            iteration=self.script_step,
            detail=self._stop_detail(stop) | {"saved_step": None, "ranks_saved": self._ranks_saved},
        )

    def _finished_line(self, stop: int) -> str:
        return (
            f"the exit signal came, but every rank ({self._world}) finished training and "
            f"exited 0 before the agreed stop step ({stop_words(stop, self.script_step)})"
        )

    def _not_saved(self, stop: int) -> str:
        """The ranks stopped without every one of them saving the stop step: where the
        next run starts, as far as their reported saves show it (the script's steps)."""
        head = (
            f"stopped {stop_words(stop, self.script_step)} without a checkpoint of it "
            f"({self._ranks_saved} of {self._world} rank(s) saved it)"
        )
        last = list(self._last_saves.values())
        steps = {s for s in last if s is not None}
        if last and len(steps) == 1 and None not in last:
            return (
                f"{head}: the next run starts from script step {steps.pop()}, the last save "
                "every rank completed"
            )
        if steps and None not in last:
            return (
                f"{head}: the next run starts from the last save every rank completed, "
                f"script step {min(steps)} at the latest (their last saves: script steps "
                f"{min(steps)} to {max(steps)})"
            )
        reported = len(last) - last.count(None)
        return f"{head}: the next run starts from the last checkpoint the script wrote, if any " + (
            f"({reported} of {len(last)} rank(s) reported a completed save)"
            if reported
            else "(no rank reported a completed save)"
        )

    def saved_line(self) -> str:
        """What the preemption saved, as seen in the ranks' last heartbeats: the end of
        the launcher's preemption line."""
        step = self.coordinator.stop_at
        if self._saved is not None:
            return f"every rank saved script step {self._saved}: the next run resumes there"
        if self.finished and step is not None:
            return f"{self._finished_line(step)}: the job completed, nothing to resume"
        if step is None:
            return (
                "no stop step was agreed, nothing was saved: the next run starts from the "
                "last checkpoint the script wrote before, if any"
            )
        return self._not_saved(step)

    def status(self) -> PreemptionBlock:
        budget = self.budget.block()
        coord = self.coordinator
        if not coord.active:
            return PreemptionBlock(budget=budget)
        return PreemptionBlock(
            budget=budget,
            active=True,
            signal=signal.Signals(coord.sig).name,
            reason=coord.reason,
            stop_at_step=coord.stop_at,
            stop_at_script_step=self.script_step,
            preempt_time_s=coord.cfg.preempt_time,
            terminated_pids=tuple(coord.terminated),
            saved_step=self._saved,
            ranks_saved=self._ranks_saved,
            saved=self.saved_line(),
        )


def _preempt_block(rec: HeartbeatRecord) -> PreemptBlock | None:
    """The record's ``preempt`` block; a malformed one counts as none."""
    try:
        return read_block(rec, PreemptBlock)
    except ValueError:
        return None


_MAX_REASON = 200  # longest reason accepted from the store


def _preempt_payload(raw: Any) -> tuple[int | None, str] | str:
    """The ``preempt`` key's (stop step, reason), or why it is not one."""
    try:
        payload = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        return "not JSON"
    if not isinstance(payload, dict):
        return f"expected an object, got {type(payload).__name__}"
    step, reason = payload.get("stop_at_step"), payload.get("reason")
    if step is not None and (type(step) is not int or step < 0):
        return "stop_at_step: expected an integer >= 0 or null"
    if type(reason) is not str or len(reason) > _MAX_REASON:
        return f"reason: expected a text of at most {_MAX_REASON} characters"
    return step, safe_text(reason)
