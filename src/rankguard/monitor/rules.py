"""The monitor's verdicts: pure logic, no files, no threads, an injected clock.

Each rank has two independent states, and a finding fires once per episode:

process_liveness (``Liveness``)
    not_observed -> alive (first record) -> stale (no record for process_timeout_s,
    checkpoint_timeout_s while checkpointing) -> alive (records again) ... -> exited
    (``process_end`` seen, or the pid vanished).
gpu_progress (``Progress``)
    not_observed -> starting (records, no step yet) -> progressing <-> stalled;
    unknown while the process is stale (one cause, one finding) or after an error
    exit; completed after a clean exit.

Ages use the monitor's own monotonic clock (the time it first saw each record) plus the
publisher's own "seconds since progress" measured on the publisher's clock, so no two
hosts' clocks are ever compared. A finding's episode key is (rank, pid, type); the key is
cleared when the condition clears, so a relapse fires again. A new pid for a known rank
(restart) resets the rank; records of another run_id are ignored.

Phases have their own timeouts: ``checkpoint_timeout_s`` while checkpointing (the API's
checkpoint or a save recognised on the stack, or a wait for a background write) and
while the session closes after the script ended (``closing``: the trackers' flush),
``eval_timeout_s`` while evaluating, section timeouts (NVRx's ``rank_section_timeouts``:
``setup``, ``step`` for train, ``checkpointing``, any other phase by its name, else the
out-of-section timeout) when configured. An evaluation before the first step is judged as
one after it (nanoGPT evaluates at iteration 0), not by set-up's timeout. In ``train``
(and ``setup``) the progress age counts from the later of the last step and the first
record back in that phase after another (monitor clock), so the first step after a long
evaluation or save is not late. A rank stalled in
``train`` while a peer is in another phase (rank 0 saving alone, the others waiting at
the next collective) is ``blocked_by`` that peer, not hung, for as long as the peer's
phase timeout; the peer's own timeout names it if it never comes back.

A rank that vanishes without ``process_end`` while it is stale on a full disk is not
reported as died: the ``process_end`` of a clean exit is lost the same way; its ``exit``
says so (``on_full_disk``) and the agent's exit codes decide how the job ended.
A rank that goes stale on a node whose disk is full (:meth:`HeartbeatRules.note_disk`,
fed by the monitor each scan) gets ``node_disk_full`` instead of
``rank_process_heartbeat_timeout``: its heartbeats cannot be written, which says nothing
about the process, and killing it would not free the disk. The episode ends when its
heartbeats resume; if they have not resumed one process timeout after the disk has
space again, the rank is unresponsive after all and gets the heartbeat timeout.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.hangclass import HangClass, classify
from rankguard.monitor.lostnode import LostNode
from rankguard.rank.timeline import (
    CHECKPOINT_PHASE,
    CLOSING_PHASE,
    EVAL_PHASE,
    RESTART_PHASE,
    SETUP_PHASE,
    TRAIN_PHASE,
)
from rankguard.schema.blocks import InProcessBlock, exit_clean, read_block
from rankguard.schema.cadence import Cadence
from rankguard.schema.coerce import as_list
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.findings import Finding, FindingType, Liveness, Progress, Reason
from rankguard.schema.frames import waits_in_collective
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.records import MAX_RANKS, Event, HeartbeatRecord, RecordError, supersedes
from rankguard.util.disk import DiskState

__all__ = [
    "NAMED_AT",
    "NEVER_SEEN_EACH",
    "RUN_END",
    "FindingType",
    "HeartbeatRules",
    "Liveness",
    "Progress",
    "RankState",
    "Reason",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RankState:
    rank: int
    pid: int | None = None
    record: HeartbeatRecord | None = None  # latest record of the current pid
    seen_at: float | None = None  # monitor clock when ``record`` was first seen
    start_wall_ns: int | None = None
    start_mono_ns: int | None = None  # the same start by the host's monotonic clock
    liveness: Liveness = Liveness.NOT_OBSERVED
    progress: Progress = Progress.NOT_OBSERVED
    heartbeat_age_s: float | None = None
    progress_age_s: float | None = None
    gpu_health: JsonObject | None = None
    active: set[FindingType] = field(default_factory=set)  # finding types active for this pid
    # the active types that came with a finding (the others are held as state only: an
    # exit after the launcher's stop, a restart or a peer's failure)
    fired: set[FindingType] = field(default_factory=set)
    blocked_by: list[int] = field(default_factory=list)  # culprits a stalled rank waits on
    stall: tuple[float, float] | None = None  # (timeout, age) while over the progress timeout
    culprits_gone_at: float | None = None  # when the ranks a victim waited on recovered
    train_since: float | None = None  # first record back in train after another phase
    phases_seen: dict[str, None] = field(default_factory=dict)  # in order, at most 16
    late: bool = False  # heartbeats older than fresh_s, not yet past the process timeout
    resumed_at: float | None = None  # heartbeats back after a pause of the process
    # a victim's end (its peer went away) held until then: the cause may still be relayed
    held_until: float | None = None
    # the record's collectives block, parsed once per record (the record it came from)
    collectives: tuple[HeartbeatRecord, CollectivesBlock | None] | None = None
    # the record after which its heartbeats were named stopped before its timeout (a
    # restart or the run's end cut the wait short): stale until a newer record
    named_silent: HeartbeatRecord | None = None

    @property
    def reported(self) -> set[FindingType]:
        """The active types a finding was written for (what status calls active)."""
        return self.active & self.fired

    def reset(self, pid: int) -> None:
        self.pid = pid
        self.record = None
        self.seen_at = None
        self.start_wall_ns = None
        self.start_mono_ns = None
        self.liveness = Liveness.NOT_OBSERVED
        self.progress = Progress.NOT_OBSERVED
        self.heartbeat_age_s = None
        self.progress_age_s = None
        self.active = set()
        self.fired = set()
        self.blocked_by = []
        self.stall = None
        self.culprits_gone_at = None
        self.train_since = None
        self.phases_seen = {}
        self.late = False
        self.resumed_at = None
        self.held_until = None
        self.collectives = None
        self.named_silent = None


HealthLookup = Callable[[HeartbeatRecord], "JsonObject | None"]


#: The ``detail`` key of a heartbeat timeout named before the timeout ran out, when a
#: restart for its peer's broken collective (its reason) or the run's end (``run_end``)
#: cut the wait short: the group it belonged to is being replaced or is gone, so fault
#: tolerance acts on nothing for it.
NAMED_AT = "named_at"
RUN_END = "run_end"  # NAMED_AT's value when the run's end cut the wait short

#: Up to this many ranks never seen get a finding each; more get one finding together.
NEVER_SEEN_EACH = 8
NEVER_SEEN_SAMPLE = 32  # ranks named in that finding's detail


class HeartbeatRules:
    """Feed records with :meth:`ingest`, call :meth:`evaluate` once per scan."""

    def __init__(
        self,
        cfg: HeartbeatConfig,
        run_id: str,
        *,
        expected_world_size: int | None,
        started_at: float,
        section_timeouts: dict[str, float] | None = None,
        out_of_section_timeout: float | None = None,
        max_world_size: int | None = None,
        cadence: Cadence | None = None,
    ) -> None:
        """``max_world_size``: the most ranks the rendezvous allows (max nodes x ranks
        per node; records claiming more, or of a rank past it, are ignored).
        ``section_timeouts``: ``step``, ``setup`` and ``checkpointing`` replace the
        progress timeouts of the train phase, before the first step and while saving;
        any other name is the timeout of that phase (eval, a user section), and
        ``out_of_section_timeout`` that of a phase without one. ``cadence``: the
        launcher's (:mod:`rankguard.schema.cadence`), which then gives the section timeouts;
        without one, it is derived from ``cfg`` and those arguments."""
        self.cfg = cfg
        if cadence is None:
            cadence = Cadence.of(
                cfg, sections=section_timeouts, out_of_section_s=out_of_section_timeout
            )
        self.cadence = cadence
        self.section_timeouts = dict(cadence.sections)
        self.out_of_section_timeout = cadence.out_of_section_s
        self.run_id = run_id
        self.expected_world_size = expected_world_size
        self.rank_limit = expected_world_size or max_world_size or MAX_RANKS
        self.started_at = started_at
        self.ranks: dict[int, RankState] = {}
        self._hosts: dict[str | None, dict[int, None]] = {}  # hostname -> ranks seen there
        self.ignored_records = 0
        self.last_ignored: str | None = None
        self.rank_errors = 0  # evaluations of one rank that raised (logged, skipped)
        self.root_cause: tuple[int, int | None] | None = None  # from the agent
        self.findings_total = 0
        self._never_seen_upto = 0  # ranks below it were seen or reported never seen
        self._first_sighting: float | None = None
        self.first_failure: tuple[int, float] | None = None  # (rank, monitor time)
        self.shutdown: str | None = None  # why the launcher is stopping the workers
        self.restarting: str | None = None  # why the worker group is being restarted
        # a restart for a rank whose peer went away, its cause not seen yet: until then a
        # rank's own error is still that cause (it comes a relay period later)
        self.cause_pending_until: float | None = None
        self.ending = False  # the launcher's run is over: nothing is held any more
        self.generation = 0  # counts ranks' new processes (restarts): failure episodes
        # node (None: every node without its own report) -> its disk, when it had space
        # again (None while full or never full)
        self.disks: dict[int | None, tuple[DiskState, float | None]] = {}
        self._due = _DueRanks(cfg.incremental_rules)
        #: A rank's heartbeats are fresh while its latest record is at most this old
        #: (:attr:`Cadence.fresh_s`): only then can it be "alive and not progressing". A
        #: process that publishes no record for longer (SIGSTOP, swap) is late: not
        #: judged on progress until its records come back.
        self.fresh_s = cadence.fresh_s
        self._fresh_ns = int(self.fresh_s * 1e9)
        self._retired: set[tuple[int, int]] = set()  # (rank, pid) of a smaller group's past
        self._shrunk_to: int | None = None  # the world of a group re-formed smaller
        self._silent_at: float | None = None  # the scan time _silent was found at
        self._silent: tuple[float, int] | None = None
        # when a restart for a rank whose peer went away was noted, its cause not seen
        # (note_restart's cause_pending): the ends it explains are judged once, before
        # a new process of a rank hides what the restart cut short (_settle_held)
        self._peer_restart_at: float | None = None
        self._settle_due = False
        self._named: list[Finding] = []  # found outside evaluate, returned by the next
        self._lost: LostNode | None = None  # a node the previous round lost (note_lost_node)

    # ---- input ----------------------------------------------------------------------

    def world_size(self) -> int:
        if self.expected_world_size:
            return self.expected_world_size
        sizes = [s.record.world_size or 0 for s in self.ranks.values() if s.record]
        if self._shrunk_to is not None:  # the old group's last records say more ranks
            sizes = [min(size, self._shrunk_to) for size in sizes]
        return max(sizes, default=0)

    def accept(self, raw: JsonObject | HeartbeatRecord) -> HeartbeatRecord | None:
        """The record typed and checked against this job, or None (counted in
        ``ignored_records``, the latest reason in ``last_ignored``) when it is invalid,
        of another run or of a rank outside the job."""
        if isinstance(raw, HeartbeatRecord):
            record = raw
        else:
            try:
                record = HeartbeatRecord.from_dict(raw, max_ranks=self.rank_limit)
            except RecordError as exc:
                self._ignore(f"invalid record: {exc}")
                return None
        if record.run_id != self.run_id:
            self._ignore(f"record of another run ({record.run_id[:64]!r})")
            return None
        if record.rank >= self.rank_limit:
            self._ignore(f"rank {record.rank} outside the job")
            return None
        world = record.world_size
        if self.expected_world_size is None and world is not None and world > self.rank_limit:
            self._ignore(f"world_size {world} past the job's {self.rank_limit} ranks")
            return None
        return record

    def _ignore(self, why: str) -> None:
        self.ignored_records += 1
        self.last_ignored = why

    def ingest(self, raw: JsonObject | HeartbeatRecord, now: float) -> bool:
        """Apply one record; False when it is ignored (invalid, other run, old pid,
        duplicate). Never raises for a bad record."""
        record = self.accept(raw)
        if record is None:
            return False
        rank = record.rank
        if (rank, record.pid) in self._retired:
            self._ignore(f"record of rank {rank}'s process retired with its node")
            return False
        shrunk = self._shrunk_to
        if shrunk is not None and record.event is Event.PROCESS_START:
            # a process of a new, larger group (a node joined again): no cap any more
            self._shrunk_to = None if (record.world_size or 0) > shrunk else shrunk
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank=rank)
        if not supersedes(
            record,
            state.record,
            old_start_ns=state.start_wall_ns,
            old_start_mono_ns=state.start_mono_ns,
        ):
            if state.record is not None and record.pid != state.record.pid:
                self._ignore(f"late record of a replaced process of rank {rank}")
            return False
        if state.pid != record.pid or (
            state.record is not None and state.record.hostname != record.hostname
        ):
            had_process = state.pid is not None
            if had_process and self._settle_due:
                self._settle_held(now)  # before a new process hides what it waited for
            state.reset(record.pid)
            if self.first_failure is not None and self.first_failure[0] == rank:
                self.first_failure = None  # the failed rank was restarted: episode over
            if had_process:
                self.generation += 1  # a new process of a rank: a new episode
                self.restarting = None  # the new worker group is up
                self._peer_restart_at = None
                self.cause_pending_until = None
                self.root_cause = None
        previous = state.record
        if record.phase in _RESUMED_PHASES and previous is not None and _busy(state):
            state.train_since = now  # back in train (or setup) after eval, a save, a section
        if previous is not None:  # of the same process (a new pid reset the state)
            before, after = previous.monotonic_ns, record.monotonic_ns
            if before is not None and after is not None and after - before > self._fresh_ns:
                # published nothing for longer than fresh_s on its own clock (stopped,
                # then continued): the stopped time is not time without progress
                state.resumed_at = now  # the progress clock restarts (see _progress)
        if record.phase and len(state.phases_seen) < 16:
            state.phases_seen.setdefault(record.phase)
        if previous is None or previous.hostname != record.hostname:
            self._hosts.setdefault(record.hostname, {})[rank] = None
        state.record = record
        state.seen_at = now
        if self._first_sighting is None:
            self._first_sighting = now
        if record.event is Event.PROCESS_START or state.start_wall_ns is None:
            state.start_wall_ns = record.wall_time_ns
            state.start_mono_ns = record.monotonic_ns
        self._due.changed(rank, record.node_rank)
        return True

    def ranks_on(self, hostname: str | None) -> list[RankState]:
        """The states of the ranks ever seen on ``hostname`` (their latest record may
        be from another host since), in the order first seen there: node 0's pid checks
        look at its own host's few ranks, not at every rank of the job."""
        ranks = self.ranks
        return [s for r in self._hosts.get(hostname, ()) if (s := ranks.get(r)) is not None]

    def retire_ranks(self, world: int, now: float | None = None) -> list[int]:
        """The group re-formed with ``world`` ranks, without nodes that left it (bad-node
        exclusion): the ranks at or past ``world`` are no longer part of the job. Their
        states go, and their processes' records (a relay's last push) are ignored from
        now on; a new process of such a rank (a node joined again) is a new rank state.
        The ranks retired. ``now``: the monitor's clock (the ends a restart cut short
        are judged first, see :meth:`note_restart`)."""
        if self._settle_due:
            at = self._peer_restart_at
            self._settle_held(now if now is not None else at if at is not None else 0.0)
        gone = sorted(r for r in self.ranks if r >= world)
        for rank in gone:
            state = self.ranks.pop(rank)
            if state.pid is not None:
                self._retired.add((rank, state.pid))
        if self.first_failure is not None and self.first_failure[0] >= world:
            self.first_failure = None  # that episode ended with the node's exclusion
        if self.root_cause is not None and self.root_cause[0] >= world:
            self.root_cause = None
        self._shrunk_to = world
        self._never_seen_upto = min(self._never_seen_upto, world)
        return gone

    def mark_node(self, node_rank: int | None) -> None:
        """Something about node ``node_rank`` beyond its records changed (its GPU health
        snapshot, or that snapshot went stale): its ranks are evaluated at the next scan."""
        self._due.mark_node(node_rank)

    def note_replaced(self, rank: int, pid: int) -> bool:
        """Live recovery: rank ``rank``'s process ``pid`` ended and a standby takes its
        place (a new pid of the rank soon, which resets the rank's state before a scan
        sees that end). True when the caller writes the end's finding: the scans will
        not (the state is marked); False when a scan has written it already."""
        s = self.ranks.get(rank)
        if s is None or s.pid != pid:
            return True
        if FindingType.PROCESS_EXITED in s.active:
            return False
        s.active.add(FindingType.PROCESS_EXITED)
        return True

    def note_root_cause(self, rank: int, pid: int | None) -> None:
        """This node's agent saw its worker group fail and names ``rank`` (``pid``) as
        the root cause from the exit codes: among ranks ended in the same scan, it is
        blamed first (a rank SIGKILLed from outside and a peer that died in the
        broken collective both end without a record saying why)."""
        self.root_cause = (rank, pid)

    def note_restart(
        self, reason: str, *, cause_pending: bool = False, now: float | None = None
    ) -> None:
        """The worker group is being restarted: exits until new processes appear are
        the restart's doing, not findings. ``cause_pending``: the restart is for a rank
        whose collective broke (a peer went away) and no rank was seen failing first:
        the peer's own end, relayed from another node, may arrive after this note; for
        one relay period after ``now`` an exit with a rank's own error (not a peer
        failure, not a signal) is still named as that cause.

        Such a restart also ends the wait of a victim's end held for a peer whose
        heartbeats went silent (a lost node sends no end): that peer is named then (its
        heartbeats stopped before the restart, its process or node lost), and the end is
        its echo; the new processes would otherwise replace both before the peer's
        process timeout. Judged at the next scan, or before a new process of a rank is
        taken in, whichever comes first."""
        pending = cause_pending and now is not None and self.first_failure is None
        self.cause_pending_until = now + self.fresh_s if pending and now is not None else None
        self._peer_restart_at = now if pending else None  # before: a scan reads it after
        self.restarting = reason
        self._settle_due = True

    def note_lost_node(self, lost: LostNode) -> None:
        """This monitor started on a node renumbered 0 after the previous round lost
        node ``lost.node`` (node 0's monitor went with it, see :mod:`.lostnode`): its
        first rank is named now (returned by the next :meth:`evaluate`; fault tolerance
        acts on nothing for it, the restart that replaced its group is done), and an
        end of that round (written before ``lost.before_ns``) whose collective broke
        is recorded as its echo, not named."""
        self._lost = lost
        rank = lost.ranks[0]
        found = Finding.build(
            FindingType.PROCESS_TIMEOUT,
            Reason.UNRESPONSIVE,
            run_id=self.run_id,
            rank=rank,
            message=lost.message(),
            hostname=lost.hostname,
            node_rank=lost.node,
            process_liveness=Liveness.STALE,
            gpu_progress=Progress.UNKNOWN,
            detail={NAMED_AT: lost.restart, "lost_node": lost.to_dict()},
        )
        self._named.append(found)

    def _echo_of_lost(self, s: RankState, rec: HeartbeatRecord) -> bool:
        """Rank ``s``'s end (``rec``) is a survivor's of the round that lost a node
        (:meth:`note_lost_node`): its collective broke before the new round formed.
        Recorded as the lost rank's echo; False when it is not one."""
        lost = self._lost
        if (
            lost is None
            or s.rank in lost.ranks
            or rec.wall_time_ns >= lost.before_ns
            or not peer_failure((rec.exit or {}).get("error"))
        ):
            return False
        s.held_until = None
        s.active.add(FindingType.PROCESS_EXITED)
        s.record = rec.with_exit(after_failure_of_rank=lost.ranks[0])
        return True

    def cancel_restart(self, reason: str) -> None:
        """The restart noted with ``reason`` will not happen (its kill failed): exits
        are findings again."""
        if self.restarting == reason:
            self.restarting = None
            self._peer_restart_at = None
            self._settle_due = False

    def note_disk(self, node_rank: int | None, disk: DiskState, now: float) -> None:
        """The disk state of node ``node_rank``'s run directory (None: of every node that
        reports none of its own, as with a shared filesystem), measured at ``now``."""
        known = self.disks.get(node_rank)
        if disk.full:
            freed_at = None
        elif known is not None and known[0].full:
            freed_at = now
        else:
            freed_at = known[1] if known is not None else None
        self.disks[node_rank] = (disk, freed_at)

    def disk_of(self, node_rank: int | None) -> DiskState | None:
        """The latest disk state of a node (its own, else the shared one)."""
        known = self.disks.get(node_rank) or self.disks.get(None)
        return known[0] if known is not None else None

    def _full_disk(self, s: RankState, now: float, grace_s: float) -> DiskState | None:
        """The full disk that explains why rank ``s`` is stale, if any: its node's disk
        is full, or it was and has had space for at most ``grace_s`` (the heartbeats
        resume within a publish interval) while the rank's episode is still open."""
        if FindingType.PROCESS_TIMEOUT in s.active or s.record is None:
            return None  # already reported (and acted on) as unresponsive
        known = self.disks.get(s.record.node_rank) or self.disks.get(None)
        if known is None:
            return None
        disk, freed_at = known
        if disk.full:
            return disk
        if (
            FindingType.NODE_DISK_FULL in s.active
            and freed_at is not None
            and now - freed_at <= grace_s
        ):
            return disk
        return None

    def end_run(self) -> list[int]:
        """The launcher's run is over (every rank ended, or the drain gave up): an end
        held back waiting for its cause (:meth:`_exited`) is judged at the next scan
        with what is known, and a restart noted that never started a new group is said
        as such in the ends it explained. The ranks held until now."""
        self.ending = True
        held = sorted(r for r, s in self.ranks.items() if s.held_until is not None)
        for rank in held:
            self._due.again(rank)
        reason = self.restarting
        if reason is not None:  # no new group came up: nothing restarted
            for s in self.ranks.values():
                rec = s.record
                if rec is not None and rec.exit and rec.exit.get("after_restart") == reason:
                    exit_info = {k: v for k, v in rec.exit.items() if k != "after_restart"}
                    exit_info["after_action"] = f"{reason}; no new group started: the job ended"
                    s.record = replace(rec, exit=exit_info)
        return held

    def note_shutdown(self, reason: str) -> None:
        """The launcher is stopping every worker (a signal, the end of the job): exits
        from now on are its doing, not findings."""
        if self.shutdown is None:
            self.shutdown = reason

    # ---- verdicts -------------------------------------------------------------------

    def evaluate(self, now: float, health_for: HealthLookup | None = None) -> list[Finding]:
        if self._settle_due:
            self._settle_held(now)
        findings, self._named = self._named, []
        world = self.world_size()
        # Workers start after the rendezvous, which may take long on many nodes: the
        # initial timeout runs from the first rank seen (or from the monitor's start
        # while none has been seen).
        anchor = self._first_sighting if self._first_sighting is not None else self.started_at
        waited = now - anchor
        if waited > self.cadence.initial_process_timeout_s:
            findings.extend(self._never_seen_findings(world, waited))
        # Only the ranks whose verdict can have changed (see _DueRanks); the others'
        # ages move on.
        due = self._due.take(now, self.ranks)
        # Earliest failure first: when a rank fails, its peers fail in their next
        # collective or are terminated by the launcher: consequences, not culprits.
        for state in sorted(due, key=self._failure_order):
            if state.record is None:
                continue
            try:  # each rank in isolation: one rank's surprise never hides the others
                state.gpu_health = health_for(state.record) if health_for else None
                findings.extend(self._evaluate_rank(state, now))
            except Exception:
                self._due.again(state.rank)
                self.rank_errors += 1
                if self.rank_errors == 1 or self.rank_errors % 1000 == 0:
                    logger.exception("rankguard rules: evaluating rank %d failed", state.rank)
            else:
                self._due.schedule(state, self._next_due(state), now)
        self._due.age_others(now, self.ranks)
        findings.extend(self._attribute_stalls(now))
        self.findings_total += len(findings)
        return findings

    def _next_due(self, s: RankState) -> float:
        """The earliest monitor time at which evaluating rank ``s`` again could give
        another verdict without a new record (-inf: at every scan; inf: never).

        For a live rank with a given record, time only pushes its ages up across a
        threshold: the process timeout, the progress timeout, a section's timeout; once
        across, the verdict stays until the next record (the stall's age moves on in
        :meth:`_DueRanks.age_others`). So the rank is due when the first threshold it is
        not yet across may be crossed: conservatively, its progress age reaching the
        shortest progress or section timeout in force, or (outside the train phase) its
        phase's age reaching the shortest section timeout; earlier is only slower, never
        wrong. A stale rank (disk state, grace) is evaluated at every scan."""
        rec = s.record
        if rec is None or s.seen_at is None:
            return math.inf
        if rec.ended:  # held (a victim's end): at every scan, as a peer's end may come
            return -math.inf if s.held_until is not None else math.inf
        if s.liveness is not Liveness.ALIVE:
            return -math.inf
        cadence = self.cadence
        seen = s.seen_at
        due = seen + (
            cadence.checkpoint_timeout_s if rec.checkpoint_active else cadence.process_timeout_s
        )
        if not s.late:
            due = min(due, seen + self.fresh_s)
        shortest = self.cadence.shortest_progress_timeout_s
        since = rec.since_progress_s
        if since is not None and s.stall is None:
            due = min(due, seen - since + shortest)
        if rec.phase not in ("train", "step") and FindingType.SECTION_TIMEOUT not in s.active:
            due = min(due, seen - (rec.phase_elapsed_s or 0.0) + shortest)
        return due - 1e-6  # never after the crossing, whatever the rounding

    def next_due(self) -> float | None:
        """When the next rank is due without a new record (monitor clock; None: none
        is): the monitor may scan then instead of waiting for its next interval."""
        return self._due.earliest()

    def _failure_order(self, state: RankState) -> tuple[int, int]:
        """Which ended rank is the likelier cause, first: the agent's root cause, then a
        rank that raised its own error, then one that vanished (SIGKILL, hard crash),
        then one whose error says a peer went away (its collective broke because another
        rank died); each by the time of its end record."""
        rec = state.record
        if rec is None:
            return 0, 0
        info = rec.exit or {}
        root = self.root_cause
        if rec.ended and root is not None and root[0] == state.rank and root[1] in (None, rec.pid):
            kind = -1
        elif info.get("vanished"):
            kind = 1
        elif peer_failure(info.get("error")):
            kind = 2
        else:
            kind = 0
        return kind, rec.wall_time_ns

    def _attribute_stalls(self, now: float) -> list[Finding]:
        """Name the culprit of a stall, not its victims.

        In a synchronous job one stuck rank stops every other rank at its next
        collective, so all of them stop progressing. A stalled rank gets its own
        ``gpu_progress_timeout`` only when no other rank is already the known cause
        (stale, failed, or flagged as stalled) and it is among the furthest behind;
        the others are marked stalled with ``blocked_by`` naming the culprits. When all
        stalled ranks are equally far (a hang before the collective, a collective
        hang), all of them are reported, unless their main threads tell them apart:
        ranks waiting inside a ``torch.distributed`` collective are blocked by those
        outside it.
        A victim whose culprits recovered gets one more progress timeout to resume
        before it is reported in its own right.
        """
        stalled = [s for s in self.ranks.values() if s.stall is not None]
        if not stalled:
            return []
        dead = {FindingType.PROCESS_TIMEOUT, FindingType.PROCESS_EXITED, FindingType.NODE_DISK_FULL}
        # a rank whose heartbeats are late is the likely cause too (its own heartbeat
        # timeout names it if it does not come back)
        down = [s.rank for s in self.ranks.values() if s.active & dead or s.late]
        flagged = [
            (s.rank, _seq(s))
            for s in self.ranks.values()
            if FindingType.PROGRESS_TIMEOUT in s.active
        ]
        # Furthest behind among live ranks: a stalled rank ahead of a live rank is
        # waiting for it, even before that rank crosses its own timeout (its records
        # may come later, through the relay of another node).
        live = [s for s in self.ranks.values() if s.liveness is Liveness.ALIVE]
        lowest = min(_seq(s) for s in live or stalled)
        # Equally far behind, but some ranks wait inside a collective and others do
        # not: those waiting wait for the others (a hang before the collective).
        behind = [t for t in live if _seq(t) == lowest]
        # Who is behind in the sequence of collectives says it first (a rank that
        # entered collective N+1 waits on one that has not entered it); else the
        # ranks outside any collective (the recorder's status, the Python frame).
        lagging = _behind_in_collectives(behind)
        outside = (
            lagging
            if lagging is not None
            else sorted(t.rank for t in behind if not _in_collective(t))
        )
        behind_ranks = sorted(t.rank for t in behind)  # once, not once per stalled rank
        split = bool(outside) and len(outside) < len(behind)
        # Peers in a phase of their own (saving, evaluating) and within its timeout:
        # ranks waiting at the next collective meanwhile are blocked by them, not hung.
        # Once such a peer overstays (its own finding), they stay blocked by it. A peer
        # whose main thread waits inside a collective (a distributed save's all_gather)
        # is not busy with work of its own: it waits for the others, and a rank stuck
        # outside that collective is judged by its own timeout, not the peer's phase's.
        busy = [t for t in live if _busy(t)]
        working = {t.rank for t in busy if not _in_collective(t)}
        limits = {t.rank: self._phase_timeout(t) for t in busy}
        out: list[Finding] = []
        hang: list[HangClass | None] = []  # classified once, at the first hang named
        # busy ranks first: one that overstayed is named before those waiting on it
        for s in sorted(stalled, key=lambda st: (not _busy(st), st.rank)):
            if FindingType.PROGRESS_TIMEOUT in s.active:
                continue
            # Culprits: ranks down, or flagged as stalled further behind than this one.
            others = [r for r in down if r != s.rank]
            others += [r for r, seq in flagged if r != s.rank and seq < _seq(s)]
            timeout, age = s.stall  # type: ignore[misc]
            waits_on = [
                t.rank
                for t in busy
                if t.rank != s.rank
                and ((t.rank in working and age <= limits[t.rank]) or t.active & _OVERSTAYED)
            ]
            if not others and waits_on and not _busy(s):
                s.blocked_by = waits_on
                s.culprits_gone_at = None
                continue
            if not others and split and s.rank not in outside:
                others = outside
            if others or _seq(s) > lowest:
                s.blocked_by = others or behind_ranks  # s is ahead: not among them
                s.culprits_gone_at = None
                continue
            if s.blocked_by:
                if s.culprits_gone_at is None:
                    s.culprits_gone_at = now
                if now - s.culprits_gone_at <= timeout:
                    continue
            self._fire(s, FindingType.PROGRESS_TIMEOUT, Reason.NOT_ADVANCING, timeout, age, out)
            if not hang:
                hang.append(classify({t.rank: _collectives(t) for t in live}))
            if hang[0] is not None:
                out[-1].detail["hang"] = hang[0].to_dict()
                out[-1].message = f"{out[-1].message}; {hang[0].line}"
        return out

    def _evaluate_rank(self, s: RankState, now: float) -> list[Finding]:
        """One rank's verdict now: exited, process stale, heartbeats late (not judged on
        progress), or alive, then its progress in its phase and its GPU's health."""
        rec = s.record
        assert rec is not None and s.seen_at is not None
        out: list[Finding] = []
        hb_age = now - s.seen_at
        s.heartbeat_age_s = hb_age
        since = rec.since_progress_s
        s.progress_age_s = hb_age + since if since is not None else None
        s.late = False
        if rec.ended:
            self._exited(s, now, out)
            return out
        ckpt = rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE
        process_timeout = (
            self.cadence.checkpoint_timeout_s if ckpt else self.cadence.process_timeout_s
        )
        if hb_age > process_timeout or s.named_silent is rec:
            self._process_stale(s, now, process_timeout, hb_age, out)
            return out
        s.liveness = Liveness.ALIVE
        self._clear(s, FindingType.PROCESS_TIMEOUT, FindingType.NODE_DISK_FULL)
        if hb_age > self.fresh_s:
            self._heartbeats_late(s)
        elif (
            ckpt
            or (rec.progress_seq <= 0 and not _busy(s))
            or rec.phase in _TRAIN_PHASES
            or not self._in_section(s, hb_age, out)
        ):
            self._progress(s, now, ckpt)
        return out + self._check_health(s)

    def _exited(self, s: RankState, now: float, out: list[Finding]) -> None:
        """The rank ended (``process_end``, or its pid vanished): completed after a clean
        exit; after an error a finding, unless the launcher's shutdown or restart, the
        first failure of a peer or a full disk explains it."""
        rec = s.record
        assert rec is not None
        exit_info = rec.exit or {}
        s.liveness = Liveness.EXITED
        s.stall = None
        s.blocked_by = []
        clean = exit_clean(rec)
        s.progress = Progress.COMPLETED if clean else Progress.UNKNOWN
        if (
            not clean
            and exit_info.get("vanished")
            and FindingType.PROCESS_EXITED not in s.active
            and self._full_disk(s, now, self.cadence.process_timeout_s) is not None
        ):
            # Gone without a process_end while its heartbeats could not be written:
            # a clean end's last record is lost the same way, so it is not "died".
            s.active.add(FindingType.PROCESS_EXITED)
            s.record = rec.with_exit(
                on_full_disk="its process_end could not be written (full disk): "
                "how it ended is unknown here; the launcher's exit code says"
            )
            self._clear(s, FindingType.NODE_DISK_FULL)
            return
        self._clear(
            s,
            FindingType.PROCESS_TIMEOUT,
            FindingType.PROGRESS_TIMEOUT,
            FindingType.NODE_DISK_FULL,
        )
        if clean or FindingType.PROCESS_EXITED in s.active:
            return
        if self.shutdown is not None:
            s.active.add(FindingType.PROCESS_EXITED)
            s.record = rec.with_exit(after_shutdown=self.shutdown)
            return
        if self._echo_of_lost(s, rec):
            return
        if self.restarting is not None and not self._pending_cause(exit_info, now):
            at = self._peer_restart_at
            if at is not None and self._echo_of_silent(s, now, at, self.restarting, out):
                return
            s.active.add(FindingType.PROCESS_EXITED)
            s.record = rec.with_exit(after_restart=self.restarting)
            return
        first = self.first_failure
        window = self.cadence.process_timeout_s
        if first is not None and first[0] != s.rank and now - first[1] <= window:
            # Terminated as a consequence of the first failure: state only.
            s.held_until = None
            s.active.add(FindingType.PROCESS_EXITED)
            s.record = rec.with_exit(after_failure_of_rank=first[0])
            return
        if first is None and peer_failure(exit_info.get("error")) and s.seen_at is not None:
            # A victim's end (its collective broke: a peer went away) comes at once from
            # this node; the peer's own end, from another node, a relay period later.
            # Held that long, the cause is named, not its echo. A peer whose heartbeats
            # are late may be on a lost node (no end ever comes from there): held until
            # its heartbeat timeout names it, then the end is its echo.
            silent = self._silent_peer(now)
            if silent is not None and now > silent[0]:
                s.held_until = None
                s.active.add(FindingType.PROCESS_EXITED)
                s.record = rec.with_exit(after_failure_of_rank=silent[1])
                return
            hold = s.seen_at + self.fresh_s
            if silent is not None:  # not past its timeout (above): held until then
                hold = max(hold, silent[0])
            if (now < hold or silent is not None) and not self.ending:
                s.held_until = hold
                return
            if silent is not None and self._echo_of_silent(s, now, now, None, out):
                return  # the run's end cut the wait short: the silent peer is named
            early = self._ended_before(s)
            if early:  # no rank failed: a peer that left the job early broke it
                s.record = rec.with_exit(peers_ended_first=early)
        s.held_until = None
        if first is None:
            self.first_failure = (s.rank, now)
        reason = Reason.DIED if exit_info.get("vanished") else Reason.EXITED_WITH_ERROR
        self._fire(s, FindingType.PROCESS_EXITED, reason, None, None, out)

    def _settle_held(self, now: float) -> None:
        """The ends held for a cause, judged once under the restart just noted (see
        :meth:`note_restart`); what that names is returned by the next :meth:`evaluate`."""
        self._settle_due = False
        self._silent_at = None  # between two records of one scan: found again
        for s in list(self.ranks.values()):
            if s.held_until is not None and s.record is not None and s.record.ended:
                self._exited(s, now, self._named)
        self._silent_at = None

    def _echo_of_silent(
        self, s: RankState, now: float, at: float, restart: str | None, out: list[Finding]
    ) -> bool:
        """Rank ``s`` ended in a broken collective (its peer went away) and a restart
        noted at ``at`` (``restart``: its reason), or the run's end (None), ends the wait
        for its cause: when another rank's heartbeats had stopped by then (late, not
        ended, not named yet, not on a full disk), that rank is named and the end is
        its echo. False when no such rank explains it."""
        rec = s.record
        assert rec is not None
        if self.first_failure is not None or not peer_failure((rec.exit or {}).get("error")):
            return False
        silent = self._silent_peer(now)
        t = self.ranks.get(silent[1]) if silent is not None else None
        if t is None or t.record is None or t.seen_at is None or t is s:
            return False
        quiet, cadence = at - t.seen_at, self.cadence
        ckpt = t.record.checkpoint_active
        timeout = cadence.checkpoint_timeout_s if ckpt else cadence.process_timeout_s
        if (
            quiet <= self.fresh_s
            or t.active & {FindingType.PROCESS_TIMEOUT, FindingType.NODE_DISK_FULL}
            or self._full_disk(t, now, timeout) is not None
        ):
            return False
        when = "the run ended" if restart is None else f"the worker group was restarted ({restart})"
        message = (
            f"rank {t.rank} (pid {t.pid} on {t.record.hostname}): no heartbeat for "
            f"{quiet:.1f}s when {when}, before its {timeout:g}s timeout, while rank {s.rank}'s "
            "collective with it broke (its peer went away): its process or its node was "
            f"lost [phase {t.record.phase}, iteration {t.record.iteration}]"
        )
        t.liveness, t.progress = Liveness.STALE, Progress.UNKNOWN
        t.stall, t.blocked_by, t.late = None, [], False
        t.named_silent = t.record
        t.active.add(FindingType.PROCESS_TIMEOUT)
        t.fired.add(FindingType.PROCESS_TIMEOUT)
        found = self.finding(
            t, FindingType.PROCESS_TIMEOUT, Reason.UNRESPONSIVE, timeout, quiet, message=message
        )
        found.detail[NAMED_AT] = RUN_END if restart is None else restart
        out.append(found)
        self._due.again(t.rank)
        s.held_until = None
        s.active.add(FindingType.PROCESS_EXITED)
        s.record = rec.with_exit(after_failure_of_rank=t.rank)
        return True

    def _silent_peer(self, now: float) -> tuple[float, int] | None:
        """The rank whose heartbeats went silent first (late, or past its process
        timeout), as (when its timeout is crossed, rank); None when every rank that has
        not ended is fresh. One pass over the ranks a scan, only while a victim's end
        is judged."""
        if self._silent_at != now:
            self._silent_at = now
            cadence = self.cadence
            self._silent = min(
                (
                    (
                        t.seen_at
                        + (
                            cadence.checkpoint_timeout_s
                            if t.record.checkpoint_active
                            else cadence.process_timeout_s
                        ),
                        t.rank,
                    )
                    for t in self.ranks.values()
                    if t.record is not None
                    and not t.record.ended
                    and t.seen_at is not None
                    and now - t.seen_at > self.fresh_s
                ),
                default=None,
            )
        return self._silent

    def _ended_before(self, s: RankState) -> list[int]:
        """The other ranks that had ended cleanly before rank ``s`` (its peers that left
        the job while it still ran collectives with them), at most 8."""
        rec = s.record
        assert rec is not None
        return sorted(
            r
            for r, o in self.ranks.items()
            if r != s.rank
            and o.record is not None
            and o.record.ended
            and exit_clean(o.record)
            and o.record.wall_time_ns <= rec.wall_time_ns
        )[:8]

    def _pending_cause(self, exit_info: JsonObject, now: float) -> bool:
        """During a restart noted with its cause pending (:meth:`note_restart`): whether
        this end, with its own error, is that cause."""
        until = self.cause_pending_until
        if until is None or now > until or self.first_failure is not None:
            return False
        error = str(exit_info.get("error") or "")
        return (
            bool(error)
            and not exit_info.get("vanished")
            and not peer_failure(error)
            and not _SIGNAL_END.search(error)
        )

    def _process_stale(
        self, s: RankState, now: float, process_timeout: float, hb_age: float, out: list[Finding]
    ) -> None:
        """No heartbeat for the process timeout: the heartbeat timeout (progress is not
        judged: one cause, one finding), or ``node_disk_full`` when its node's disk is."""
        s.liveness = Liveness.STALE
        s.progress = Progress.UNKNOWN
        s.stall = None
        s.blocked_by = []
        s.culprits_gone_at = None
        self._clear(s, FindingType.PROGRESS_TIMEOUT)
        disk = self._full_disk(s, now, process_timeout)
        if disk is not None:
            self._fire(
                s,
                FindingType.NODE_DISK_FULL,
                Reason.DISK_FULL,
                process_timeout,
                hb_age,
                out,
                detail={"disk": disk.to_dict()},
            )
            return
        self._clear(s, FindingType.NODE_DISK_FULL)
        self._fire(
            s, FindingType.PROCESS_TIMEOUT, Reason.UNRESPONSIVE, process_timeout, hb_age, out
        )

    @staticmethod
    def _heartbeats_late(s: RankState) -> None:
        """Heartbeats late (older than :attr:`fresh_s`) but not yet past the process
        timeout: a stopped or swapping process, not one alive and not progressing. Its
        progress is unknown and not judged; the heartbeat timeout names it if it does
        not come back, and a stall it caused in its peers is theirs to wait on."""
        s.late = True
        s.progress = Progress.UNKNOWN
        s.stall = None
        s.blocked_by = []
        s.culprits_gone_at = None

    def _in_section(self, s: RankState, hb_age: float, out: list[Finding]) -> bool:
        """Outside setup, train and saves (an evaluation before the first step too): a
        phase with a section timeout of its own (a named section, or any phase with the
        out-of-section timeout) is judged by that timeout instead of progress; True when
        it was."""
        rec = s.record
        assert rec is not None
        phase = rec.phase or ""
        if (
            phase == EVAL_PHASE
            and EVAL_PHASE not in self.section_timeouts
            and self.out_of_section_timeout is None
        ):
            return False  # eval_timeout_s, a progress timeout
        section_timeout = self.section_timeouts.get(phase, self.out_of_section_timeout)
        if section_timeout is None:
            return False
        if phase == RESTART_PHASE:
            section_timeout = max(section_timeout, _standby_wait(rec))
        self._check_section(s, phase, section_timeout, hb_age, out)
        s.progress = Progress.PROGRESSING
        s.stall = None
        s.blocked_by = []
        self._clear(s, FindingType.PROGRESS_TIMEOUT)
        return True

    def _progress(self, s: RankState, now: float, ckpt: bool) -> None:
        """Fresh heartbeats: progressing, or stalled past the timeout of its phase (a
        stall is attributed, culprit or victim, in :meth:`_attribute_stalls`)."""
        rec = s.record
        assert rec is not None
        cadence = self.cadence
        started = rec.progress_seq > 0
        phase = rec.phase or ""
        age = s.progress_age_s
        if ckpt:
            progress_timeout = cadence.checkpointing_timeout_s
        elif not started and not _busy(s):  # an evaluation before step 1 is an evaluation
            progress_timeout = cadence.setup_timeout_s
        elif phase in _TRAIN_PHASES:
            progress_timeout = cadence.step_timeout_s
        else:
            progress_timeout = self._own_timeout(phase)
        if age is not None:
            age = _stall_age(s, rec, now, age)
        self._clear(s, FindingType.SECTION_TIMEOUT)
        if age is not None and age > progress_timeout:
            s.progress = Progress.STALLED
            s.stall = (progress_timeout, age)  # attributed in _attribute_stalls
        else:
            s.progress = Progress.PROGRESSING if started else Progress.STARTING
            s.stall = None
            s.blocked_by = []
            s.culprits_gone_at = None
            self._clear(s, FindingType.PROGRESS_TIMEOUT)

    def _phase_timeout(self, s: RankState) -> float:
        """How long rank ``s`` may stay in its current (non-train) phase."""
        rec = s.record
        assert rec is not None
        sections = self.section_timeouts
        if rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE:
            return self.cadence.checkpointing_timeout_s
        phase = rec.phase or ""
        if phase in sections:
            return max(sections[phase], _standby_wait(rec) if phase == RESTART_PHASE else 0.0)
        if self.out_of_section_timeout is not None:
            return self.out_of_section_timeout
        return self._own_timeout(phase)

    def _own_timeout(self, phase: str) -> float:
        """A phase's timeout without section timeouts: eval's, the checkpoint timeout
        while the session closes, else the progress timeout."""
        cadence = self.cadence
        if phase == EVAL_PHASE:
            return cadence.eval_timeout_s
        if phase == CLOSING_PHASE:
            return cadence.checkpoint_timeout_s
        return cadence.progress_timeout_s

    def _check_section(
        self, s: RankState, phase: str, timeout: float, hb_age: float, out: list[Finding]
    ) -> None:
        assert s.record is not None
        elapsed = (s.record.phase_elapsed_s or 0.0) + hb_age
        if elapsed > timeout:
            reason = (
                Reason.SECTION_EXCEEDED if phase in self.section_timeouts else Reason.OUT_OF_SECTION
            )
            self._fire(s, FindingType.SECTION_TIMEOUT, reason, timeout, elapsed, out)
        else:
            self._clear(s, FindingType.SECTION_TIMEOUT)

    def _check_health(self, s: RankState) -> list[Finding]:
        out: list[Finding] = []
        health = s.gpu_health or {}
        verdict = None if health.get("stale") else health.get("health")
        if verdict == "unhealthy":
            self._fire(s, FindingType.HEALTH_FAILURE, Reason.GPU_UNHEALTHY, None, None, out)
        else:
            self._clear(s, FindingType.HEALTH_FAILURE)
        if verdict == "warning":
            self._fire(s, FindingType.HEALTH_WARNING, Reason.GPU_WARNING, None, None, out)
        else:
            self._clear(s, FindingType.HEALTH_WARNING)
        return out

    # ---- findings -------------------------------------------------------------------

    @staticmethod
    def _clear(s: RankState, *types: FindingType) -> None:
        for t in types:
            s.active.discard(t)

    def _fire(
        self,
        s: RankState,
        ftype: FindingType,
        reason: Reason,
        timeout_s: float | None,
        observed_s: float | None,
        out: list[Finding],
        *,
        detail: JsonObject | None = None,
    ) -> None:
        if ftype in s.active:
            return
        s.active.add(ftype)
        s.fired.add(ftype)
        found = self.finding(s, ftype, reason, timeout_s, observed_s)
        found.detail.update(detail or {})
        out.append(found)

    def finding(
        self,
        s: RankState,
        ftype: FindingType,
        reason: Reason,
        timeout_s: float | None,
        observed_s: float | None,
        message: str | None = None,
    ) -> Finding:
        """The finding about rank ``s`` as the monitor sees it now."""
        rec = s.record
        observed_s = _reported(observed_s, timeout_s)
        return Finding.build(
            ftype,
            reason,
            run_id=self.run_id,
            rank=s.rank,
            message=message or _message(ftype, reason, s, timeout_s, observed_s),
            record=rec,
            pid=s.pid,
            process_liveness=s.liveness,
            gpu_progress=s.progress,
            checkpoint_active=rec.checkpoint_active if rec else False,
            timeout_s=timeout_s,
            observed_s=observed_s,
            gpu_health=s.gpu_health,
            exit=rec.exit if rec else None,
            main_frame=rec.main_frame if rec else None,
        )

    def _never_seen_findings(self, world: int, waited: float) -> list[Finding]:
        """The ranks below ``world`` not seen yet nor reported: one finding each when
        few, else one finding for all of them (a sample of their ranks in its detail)."""
        if world <= self._never_seen_upto:
            return []
        first, self._never_seen_upto = self._never_seen_upto, world
        count, sample = 0, list[int]()
        for rank in range(first, world):
            if rank not in self.ranks:
                count += 1
                if len(sample) < NEVER_SEEN_SAMPLE:
                    sample.append(rank)
        if count <= NEVER_SEEN_EACH:
            return [self._never_seen(rank, waited) for rank in sample]
        return [self._never_seen_many(count, sample, waited)]

    def _never_seen_many(self, count: int, sample: list[int], waited: float) -> Finding:
        timeout = self.cadence.initial_process_timeout_s
        shown = ", ".join(map(str, sample[:8]))
        more = f" and {count - 8} more" if count > 8 else ""
        finding = self.finding(
            RankState(rank=sample[0]),
            FindingType.PROCESS_TIMEOUT,
            Reason.NEVER_OBSERVED,
            timeout,
            waited,
            message=f"{count} ranks have published no heartbeat {waited:.1f}s after the "
            f"job's first rank was seen (ranks {shown}{more}; "
            f"initial_process_timeout_s={timeout:g})",
        )
        finding.detail.update(never_seen_count=count, never_seen_ranks=[*sample])
        return finding

    def _never_seen(self, rank: int, waited: float) -> Finding:
        timeout = self.cadence.initial_process_timeout_s
        return self.finding(
            RankState(rank=rank),
            FindingType.PROCESS_TIMEOUT,
            Reason.NEVER_OBSERVED,
            timeout,
            waited,
            message=f"rank {rank} has published no heartbeat {waited:.1f}s after the "
            f"job's first rank was seen (initial_process_timeout_s={timeout:g})",
        )


class _DueRanks:
    """Which ranks a scan evaluates: with ``incremental``, those with a new record, of a
    node marked changed, or whose due time (:meth:`HeartbeatRules._next_due`) came;
    without it (and at the first scan), every rank. A rank's verdict depends only on
    its record, the time, its GPU health and the job-wide notes (shutdown, restart,
    root cause, first failure, disks), and those notes matter only to a rank that just
    ended or is stale, which is due anyway: so the verdicts are those of evaluating every
    rank (``tests/unit/monitor/test_incremental.py`` checks it on random histories).
    """

    __slots__ = (
        "_at",
        "_dirty",
        "_every",
        "_heap",
        "_node_ranks",
        "_order",
        "_started",
        "incremental",
    )

    def __init__(self, incremental: bool) -> None:
        self.incremental = incremental
        self._started = False
        self._dirty: set[int] = set()
        self._every: set[int] = set()  # due at every scan
        self._at: dict[int, float] = {}  # rank -> its due time (when in the heap)
        self._heap: list[tuple[float, int]] = []
        self._node_ranks: dict[int | None, set[int]] = {}
        self._order: dict[int, int] = {}  # rank -> when first seen (the ranks' dict order)

    def changed(self, rank: int, node_rank: int | None) -> None:
        self._dirty.add(rank)
        self._order.setdefault(rank, len(self._order))
        ranks = self._node_ranks.get(node_rank)
        if ranks is None:
            ranks = self._node_ranks[node_rank] = set()
        ranks.add(rank)

    def mark_node(self, node_rank: int | None) -> None:
        self._dirty |= self._node_ranks.get(node_rank, set())

    def again(self, rank: int) -> None:
        self._every.add(rank)

    def take(self, now: float, ranks: dict[int, RankState]) -> list[RankState]:
        if not (self.incremental and self._started):
            self._started = True
            self._dirty.clear()
            return list(ranks.values())
        due = self._dirty | self._every
        self._dirty = set()
        heap, at = self._heap, self._at
        while heap and heap[0][0] <= now:
            when, rank = heapq.heappop(heap)
            if at.get(rank) == when:
                del at[rank]
                due.add(rank)
        # in the order of the ranks' dict, as a full evaluation sees them (ties of the
        # failure order keep it)
        return [ranks[r] for r in sorted(due, key=self._order.__getitem__) if r in ranks]

    def schedule(self, state: RankState, when: float, now: float) -> None:
        rank = state.rank
        if when <= now:
            self._every.add(rank)
            self._at.pop(rank, None)
            return
        self._every.discard(rank)
        if when == math.inf:
            self._at.pop(rank, None)
        elif self._at.get(rank) != when:
            self._at[rank] = when
            heapq.heappush(self._heap, (when, rank))
            if len(self._heap) > 4 * len(self._at) + 1024:  # drop entries replaced since
                self._heap = [(w, r) for r, w in self._at.items()]
                heapq.heapify(self._heap)

    def age_others(self, now: float, ranks: dict[int, RankState]) -> None:
        """The ages a full evaluation would have set on the ranks not evaluated."""
        if not self.incremental:
            return
        for s in ranks.values():
            seen = s.seen_at
            if seen is None:
                continue
            age = now - seen
            s.heartbeat_age_s = age
            rec = s.record
            since = rec.since_progress_s if rec is not None else None
            s.progress_age_s = age + since if since is not None else None
            if s.stall is not None and s.progress_age_s is not None and rec is not None:
                s.stall = (s.stall[0], _stall_age(s, rec, now, s.progress_age_s))

    def earliest(self) -> float | None:
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # replaced since
        return heap[0][0] if heap else None


def _collectives(state: RankState) -> CollectivesBlock | None:
    """The rank's ``collectives`` block (None: none, or one that does not validate),
    parsed once per record."""
    rec = state.record
    if rec is None:
        return None
    cached = state.collectives
    if cached is not None and cached[0] is rec:
        return cached[1]
    block = None
    if CollectivesBlock.name in rec.extra:
        try:
            block = read_block(rec, CollectivesBlock)
        except ValueError:
            block = None
    state.collectives = (rec, block)
    return block


def _in_collective(state: RankState) -> bool:
    """Inside a collective: by the flight recorder's status (a collective enqueued, not
    completed: DDP's reducer and FSDP's hooks wait there in C++), else by the Python
    frame (a ``torch.distributed`` call)."""
    block = _collectives(state)
    if block is not None and block.inside:
        return True
    return waits_in_collective(state.record.main_frame if state.record is not None else None)


def _behind_in_collectives(states: list[RankState]) -> list[int] | None:
    """The ranks behind in the sequence of collectives of a group every one of
    ``states`` reports, and inside none of its collectives, while another rank has
    entered a later one of that group and waits in it; None when no group tells them
    apart (or a rank reports none)."""
    blocks = {s.rank: _collectives(s) for s in states}
    if len(blocks) < 2 or any(b is None for b in blocks.values()):
        return None
    first = next(iter(blocks.values()))
    assert first is not None
    for g in first.groups:
        pos = {r: b.group(g.group) for r, b in blocks.items() if b is not None}
        if any(p is None for p in pos.values()):
            continue
        at = {r: p for r, p in pos.items() if p is not None}
        newest = max(p.enqueued for p in at.values())
        waiting = [r for r, p in at.items() if p.enqueued == newest and p.inside]
        # a rank behind but inside an earlier collective waits as well (a broadcast
        # completes on some ranks without the one that did not join): not a culprit
        behind = sorted(r for r, p in at.items() if p.enqueued < newest and not p.inside)
        if behind and waiting:
            return behind
    return None


_OVERSTAYED = {FindingType.PROGRESS_TIMEOUT, FindingType.SECTION_TIMEOUT}
_TRAIN_PHASES = (TRAIN_PHASE, "step")
_RESUMED_PHASES = (*_TRAIN_PHASES, SETUP_PHASE)  # where the clock restarts after eval


def _stall_age(s: RankState, rec: Any, now: float, age: float) -> float:
    """How long rank ``s`` has been without progress in its current phase: the clock
    restarts when train (or, before the first step, setup) resumes after eval or a save,
    and when heartbeats come back after a pause (SIGCONT); an evaluation before the first
    step counts from its own start, not from the process start."""
    if rec.checkpoint_active:
        pass
    elif rec.progress_seq <= 0 and _busy(s):
        age = min(age, (rec.phase_elapsed_s or 0.0) + (now - (s.seen_at or now)))
    elif s.train_since is not None and rec.phase in _RESUMED_PHASES:
        age = min(age, now - s.train_since)
    if s.resumed_at is not None:
        age = min(age, now - s.resumed_at)
    return age


def _busy(state: RankState) -> bool:
    """In a phase of its own (saving, evaluating, a user section), not training."""
    rec = state.record
    if rec is None or rec.ended:
        return False
    return rec.checkpoint_active or (rec.phase or SETUP_PHASE) not in (
        SETUP_PHASE,
        TRAIN_PHASE,
        "step",
    )


def _seq(state: RankState) -> int:
    return state.record.progress_seq if state.record is not None else 0


# What a rank says when it fails because a peer went away: the collective broke under
# it (gloo, NCCL, torch's distributed errors). Such an exit is an echo, not a cause.
_PEER_FAILURE = re.compile(
    r"connection (closed|reset) by peer|broken pipe|remote process exited|"
    r"DistNetworkError|DistBackendError|peer .* (closed|exited)|"
    r"ECONNRESET|Connection refused|Timed out waiting .* for peer",
    re.IGNORECASE,
)


# an end the restart itself may cause: a signal turned into an exception or an exit
_SIGNAL_END = re.compile(r"^(SystemExit|KeyboardInterrupt)|signal", re.IGNORECASE)


def peer_failure(error: object) -> bool:
    """The error of a rank whose collective broke because a peer went away (connection
    closed or reset, a remote process exited): a victim's error, not a root cause."""
    return bool(_PEER_FAILURE.search(str(error or "")))


def _reported(observed_s: float | None, timeout_s: float | None) -> float | None:
    """``observed_s`` to the millisecond, never rounded down onto the limit it passed.

    A finding fires on ``observed > timeout``; 4.0004 s past a 4 s limit would read
    ``observed_s: 4.0``, which says the limit was not passed.
    """
    if observed_s is None:
        return None
    shown = round(observed_s, 3)
    if timeout_s is not None and observed_s > timeout_s >= shown:
        shown = math.floor(timeout_s * 1000 + 1) / 1000
    return shown


def _message(
    ftype: FindingType,
    reason: Reason,
    s: RankState,
    timeout_s: float | None,
    observed_s: float | None,
) -> str:
    rec = s.record
    assert rec is not None
    who = f"rank {s.rank} (pid {s.pid} on {rec.hostname})"
    where = f"phase {rec.phase}, iteration {rec.iteration}"
    observed = "?"
    if observed_s is not None:
        # One decimal, or three where one would print the limit itself ("4.0s > 4s").
        digits = 1 if timeout_s is None or round(observed_s, 1) > timeout_s else 3
        observed = f"{observed_s:.{digits}f}"
    if ftype is FindingType.PROCESS_TIMEOUT:
        return (
            f"{who}: no heartbeat for {observed}s > {timeout_s:g}s; the process or "
            f"its heartbeat thread is unresponsive (stopped, swapping or dead) [{where}]"
        )
    if ftype is FindingType.NODE_DISK_FULL:
        return (
            f"{who}: no heartbeat for {observed}s > {timeout_s:g}s while the disk of "
            f"node {rec.node_rank or 0} is full: its heartbeats cannot be written; reported, "
            f"not killed (free space on that node ends it) [{where}]"
        )
    if ftype is FindingType.PROGRESS_TIMEOUT:
        return f"{who}: alive but no step completed for {observed}s > {timeout_s:g}s [{where}]"
    if ftype is FindingType.PROCESS_EXITED:
        exit_info = rec.exit or {}
        if reason is Reason.DIED:
            return f"{who}: process vanished without a clean end (killed or crashed) [{where}]"
        early = exit_info.get("peers_ended_first")
        why = (
            f" (its peer(s) {', '.join(map(str, early))} had exited cleanly before it: "
            "they left the job early)"
            if isinstance(early, list) and early
            else ""
        )
        return (
            f"{who}: exited with an error (exit code {exit_info.get('exit_code')}): "
            f"{exit_info.get('error')}{why} [{where}]"
        )
    if ftype is FindingType.SECTION_TIMEOUT:
        what = "section" if reason is Reason.SECTION_EXCEEDED else "out-of-section phase"
        return f"{who}: {what} {rec.phase!r} has lasted {observed}s > {timeout_s:g}s [{where}]"
    problems = ", ".join(map(str, as_list((s.gpu_health or {}).get("problems"))))
    problems = problems or "see gpu_health"
    level = "unhealthy" if ftype is FindingType.HEALTH_FAILURE else "warning"
    return f"{who}: its GPU is {level}: {problems}"


def _standby_wait(rec: HeartbeatRecord) -> float:
    """How long a rank re-entering in-process may wait at its barrier for a lost peer's
    standby that is on its way (the barrier's own bound; 0 when it waits for none): a
    standby refilled a moment before the loss is still starting its interpreter."""
    try:
        block = read_block(rec, InProcessBlock)
    except ValueError:
        return 0.0
    return (block.awaiting_standby_s or 0.0) if block is not None else 0.0
