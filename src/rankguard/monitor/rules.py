"""The job's state the monitor's verdicts read and judge: pure logic, no files, no
threads, an injected clock. The verdicts themselves are one object each in
:mod:`rankguard.monitor.verdicts`; a rank's end is judged here.

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

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.lostnode import LostNode
from rankguard.monitor.tally import FindingSet, Tally
from rankguard.monitor.verdicts import (
    NEVER_SEEN_EACH,
    Compose,
    DueRanks,
    HealthLookup,
    NeverSeen,
    RankPass,
    RankVerdicts,
    StallCulprits,
)
from rankguard.monitor.verdicts.evidence import RESUMED_PHASES, busy
from rankguard.monitor.verdicts.findings import clear, fire, rank_finding
from rankguard.monitor.verdicts.liveness import full_disk
from rankguard.schema.blocks import exit_clean
from rankguard.schema.cadence import Cadence
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.findings import Finding, FindingType, Liveness, Progress, Reason
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.records import MAX_RANKS, Event, HeartbeatRecord, RecordError, supersedes
from rankguard.util.disk import DiskState

__all__ = [
    "NAMED_AT",
    "NEVER_SEEN_EACH",
    "RUN_END",
    "FindingType",
    "HealthLookup",
    "HeartbeatRules",
    "Liveness",
    "Progress",
    "RankState",
    "Reason",
    "ScanClock",
]

logger = logging.getLogger(__name__)


class ScanClock:
    """The monitor time of the rules' latest scan, shared by the rank states it ages:
    a rank's ages at that scan are computed where they are read, not written into
    every rank at every scan (most ranks are not evaluated at a scan)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


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
    # the ages as last set (None: not evaluated yet); while ``ages`` is set, the ages
    # are those at its scan time instead, computed where read (see :class:`ScanClock`)
    frozen_ages: tuple[float | None, float | None] = (None, None)
    ages: ScanClock | None = field(default=None, repr=False, compare=False)
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
    # whether the record says the rank waits inside a collective, and whether it is in a
    # phase of its own: worked out once per record (the record each was read from; two
    # fields each, not a tuple: no allocation per record)
    inside_of: HeartbeatRecord | None = None
    inside: bool = False
    busy_of: HeartbeatRecord | None = None
    busy: bool = False
    # the record after which its heartbeats were named stopped before its timeout (a
    # restart or the run's end cut the wait short): stale until a newer record
    named_silent: HeartbeatRecord | None = None

    @property
    def heartbeat_age_s(self) -> float | None:
        """Seconds since its latest record was first seen, at the latest scan."""
        ages, seen = self.ages, self.seen_at
        if ages is None or seen is None:
            return self.frozen_ages[0]
        return ages.now - seen

    @property
    def progress_age_s(self) -> float | None:
        """Seconds without progress by its latest record, at the latest scan."""
        ages, seen, rec = self.ages, self.seen_at, self.record
        if ages is None or seen is None:
            return self.frozen_ages[1]
        since = rec.since_progress_s if rec is not None else None
        return ages.now - seen + since if since is not None else None

    def both_ages(self) -> tuple[float | None, float | None]:
        """(:attr:`heartbeat_age_s`, :attr:`progress_age_s`), in one call."""
        ages, seen = self.ages, self.seen_at
        if ages is None or seen is None:
            return self.frozen_ages
        rec = self.record
        since = rec.since_progress_s if rec is not None else None
        return ages.now - seen, ages.now - seen + since if since is not None else None

    def freeze_ages(self) -> None:
        """Keep the ages as they are now (its record or first-seen time is about to
        change): they move on again once it is evaluated."""
        if self.ages is not None:
            self.frozen_ages = (self.heartbeat_age_s, self.progress_age_s)
            self.ages = None

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
        self.frozen_ages = (None, None)
        self.ages = None
        # (a rank of the rules: sets that mark it in their tally as they change)
        active, fired = self.active, self.fired
        self.active = active.emptied() if isinstance(active, FindingSet) else set()
        self.fired = fired.emptied() if isinstance(fired, FindingSet) else set()
        self.blocked_by = []
        self.stall = None
        self.culprits_gone_at = None
        self.train_since = None
        self.phases_seen = {}
        self.late = False
        self.resumed_at = None
        self.held_until = None
        self.collectives = None
        self.inside_of = None
        self.busy_of = None
        self.named_silent = None


#: The ``detail`` key of a heartbeat timeout named before the timeout ran out, when a
#: restart for its peer's broken collective (its reason) or the run's end (``run_end``)
#: cut the wait short: the group it belonged to is being replaced or is gone, so fault
#: tolerance acts on nothing for it.
NAMED_AT = "named_at"
RUN_END = "run_end"  # NAMED_AT's value when the run's end cut the wait short


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
        self.top_rank = -1  # the highest rank in ranks (-1: none)
        # called with every record of this job as it is read, before any is ignored as
        # late or superseded: what one record says once (an in-process restart) is not
        # hidden by the rank's later record read in the same scan
        self.record_watchers: list[Callable[[HeartbeatRecord], None]] = []
        self._hosts: dict[str | None, dict[int, None]] = {}  # hostname -> ranks seen there
        self.ignored_records = 0
        self.last_ignored: str | None = None
        self.rank_errors = 0  # evaluations of one rank that raised (logged, skipped)
        self.root_cause: tuple[int, int | None] | None = None  # from the agent
        self.findings_total = 0
        self._first_sighting: float | None = None
        # --preload: the launcher forks this node's ranks once its fork server has
        # imported (True while it waits for that); when they were forked (monitor clock)
        self.ranks_forking = False
        self.ranks_forked_at: float | None = None
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
        self._due = DueRanks(cfg.incremental_rules)
        self.clock = ScanClock()  # the latest scan's time: the ranks' ages (RankState)
        # the status counts, kept up to date: every change of a rank's state touches it
        self.tally = Tally()
        # the verdicts (rankguard.monitor.verdicts): the job's, each at the scans it is
        # due, and a rank's turn
        self._never_seen = NeverSeen()
        self.rank_verdicts = RankVerdicts()
        self.verdicts = Compose(self._never_seen, RankPass(), StallCulprits())
        self.stalled: set[int] = set()  # ranks left stalled (a superset; see JobView)
        self.health_for: HealthLookup | None = None  # this scan's GPU health lookup
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
        # the ranks whose latest record moved only its clocks (RankVerdicts.ticked), with
        # that record: their ages move on at the next evaluation, without a turn
        self._ticked: list[tuple[RankState, HeartbeatRecord]] = []
        self.quiet_records = 0  # records taken in that way (without a turn)

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
        for watch in self.record_watchers:
            watch(record)
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
            if rank > self.top_rank:
                self.top_rank = rank
            tally = self.tally
            state.active, state.fired = FindingSet(tally, rank), FindingSet(tally, rank)
            tally.touch(rank)
        if not supersedes(
            record,
            state.record,
            old_start_ns=state.start_wall_ns,
            old_start_mono_ns=state.start_mono_ns,
        ):
            if state.record is not None and record.pid != state.record.pid:
                self._ignore(f"late record of a replaced process of rank {rank}")
            return False
        if self._due.incremental and self.rank_verdicts.own:
            due = self.rank_verdicts.ticked(self, state, record, now)
            if due is not None:  # only its clocks moved: no turn needed (see ticked)
                state.freeze_ages()  # until this scan's evaluation, as for any record
                state.record = record
                state.seen_at = now
                self._ticked.append((state, record))
                self.quiet_records += 1
                self._due.schedule(state, due, now)
                self.tally.place(rank, now, record.since_progress_s)
                return True
        if state.pid != record.pid or (
            state.record is not None and state.record.hostname != record.hostname
        ):
            had_process = state.pid is not None
            if had_process and self._settle_due:
                self._settle_held(now)  # before a new process hides what it waited for
            state.reset(record.pid)
            self.tally.touch(rank)
            if self.first_failure is not None and self.first_failure[0] == rank:
                self.first_failure = None  # the failed rank was restarted: episode over
            if had_process:
                self.generation += 1  # a new process of a rank: a new episode
                self.restarting = None  # the new worker group is up
                self._peer_restart_at = None
                self.cause_pending_until = None
                self.root_cause = None
        previous = state.record
        if (
            record.phase in RESUMED_PHASES
            and previous is not None
            # (in the same phase as before and not saving: it was not busy, see busy)
            and (previous.phase != record.phase or previous.checkpoint_active)
            and busy(state)
        ):
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
        if state.ages is not None:
            state.freeze_ages()  # as they were until its evaluation at the next scan
        state.record = record
        state.seen_at = now
        if self._first_sighting is None:
            self._first_sighting = now
        if record.event is Event.PROCESS_START or state.start_wall_ns is None:
            state.start_wall_ns = record.wall_time_ns
            state.start_mono_ns = record.monotonic_ns
        self._due.changed(rank, record.node_rank)
        self.tally.place(rank, now, record.since_progress_s)
        return True

    def observer_held(self, start: float, end: float) -> None:
        """The monitor itself was held up from ``start`` to ``end`` (its thread not
        scheduled: the host stalled, swapped or paused, or another thread kept the
        interpreter): what it did not watch is nobody's silence. A rank that shares the
        monitor's host was most likely held too, and its next record has not been written
        yet when the monitor wakes; each live rank's silence is counted without the hold
        (its first-seen time moves on by the part of the hold after it). A rank truly gone
        is named at most the hold later; one on another node, whose relay kept publishing,
        shows a record read at once."""
        held = end - start
        if held <= 0:
            return
        for s in self.ranks.values():
            seen, rec = s.seen_at, s.record
            if seen is None or rec is None or rec.ended or seen >= end:
                continue
            s.freeze_ages()
            s.seen_at = seen + (end - max(start, seen))
            self._due.changed(s.rank, rec.node_rank)
            self.tally.place(s.rank, s.seen_at, rec.since_progress_s)

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
            self.tally.touch(rank)
            if state.pid is not None:
                self._retired.add((rank, state.pid))
        if self.first_failure is not None and self.first_failure[0] >= world:
            self.first_failure = None  # that episode ended with the node's exclusion
        if self.root_cause is not None and self.root_cause[0] >= world:
            self.root_cause = None
        self.top_rank = max(self.ranks, default=-1)
        self._shrunk_to = world
        self._never_seen.retire(world)
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
        self.tally.touch(rank)
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
        """The previous round lost node ``lost.node`` (see :mod:`.lostnode`): this
        monitor started on a node renumbered 0 (node 0's monitor went with it), or this
        node stayed node 0 and the lost rank's heartbeats had stopped too briefly before
        the restart to be named then. Its first rank is named now, once (returned by
        the next :meth:`evaluate`; fault tolerance acts on nothing for it, the restart
        that replaced its group is done), and an end of that round (written before
        ``lost.before_ns``) whose collective broke is recorded as its echo, not named."""
        self._lost = lost
        rank = lost.ranks[0]
        t = self.ranks.get(rank)
        if t is not None and t.active & {FindingType.PROCESS_TIMEOUT, FindingType.NODE_DISK_FULL}:
            return  # named already (its timeout, or the restart that cut its peer's wait)
        found = Finding.build(
            FindingType.PROCESS_TIMEOUT,
            Reason.UNRESPONSIVE,
            run_id=self.run_id,
            rank=rank,
            message=lost.message(),
            record=t.record if t is not None else None,
            hostname=lost.hostname,
            node_rank=lost.node,
            process_liveness=Liveness.STALE,
            gpu_progress=Progress.UNKNOWN,
            detail={NAMED_AT: lost.restart, "lost_node": lost.to_dict()},
        )
        if t is not None and t.record is not None:
            # this monitor saw the rank (its node 0 stayed): its process is the lost one;
            # its own timeout, still to come, names nothing more
            self._name_silent(t)
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
        """The full disk that explains why rank ``s`` is stale, if any
        (:func:`rankguard.monitor.verdicts.liveness.full_disk`)."""
        return full_disk(self, s, now, grace_s)

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
        """This scan's findings: the job verdicts due (:mod:`rankguard.monitor.verdicts`)."""
        if self._settle_due:
            self._settle_held(now)
        findings, self._named = self._named, []
        self.health_for = health_for
        self.clock.now = now  # every rank's ages move on (none are read before the pass)
        if self._ticked:
            clock = self.clock
            for state, record in self._ticked:
                if state.record is record and state.ages is None:
                    state.ages = clock
            self._ticked = []
        findings.extend(self.verdicts.evaluate(self, now))
        self.findings_total += len(findings)
        return findings

    # ---- what the verdicts read (rankguard.monitor.verdicts.api.JobView) -------------

    def anchor(self) -> float:
        # Workers start after the rendezvous, which may take long on many nodes: the
        # initial timeout runs from the first rank seen (or from the monitor's start
        # while none has been seen). With --preload the ranks are forked once the fork
        # server has imported: from that fork (not while the launcher waits for it).
        if self._first_sighting is not None:
            return self._first_sighting
        if self.ranks_forking:
            return math.inf
        forked = self.ranks_forked_at
        return self.started_at if forked is None else max(forked, self.started_at)

    def any_seen(self) -> bool:
        return self._first_sighting is not None

    def ranks_forked(self) -> bool:
        return self.ranks_forked_at is not None

    def note_ranks_forking(self, now: float | None) -> None:
        """``--preload``: the launcher is forking this node's ranks from its fork
        server, which forks once its imports are done (``now`` None: waiting for that),
        or forked them at ``now`` (monitor clock): the initial timeout counts from then
        while no rank has been seen (:meth:`anchor`)."""
        if now is None:
            self.ranks_forking = True
            return
        self.ranks_forked_at = now
        self.ranks_forking = False

    @property
    def due_ranks(self) -> DueRanks:
        return self._due

    def evaluate_rank(self, state: RankState, now: float) -> list[Finding]:
        self.tally.touch(state.rank)
        return self._evaluate_rank(state, now)

    def next_due_of(self, state: RankState) -> float:
        return self._next_due(state)

    def judge_rank(self, state: RankState, now: float) -> tuple[list[Finding], float]:
        verdicts = self.rank_verdicts
        if self._due.incremental and verdicts.own:  # (the full turn: the reference)
            # counted alive and progressing, nothing notable (no finding: see advanced)
            as_counted = (
                state.liveness is Liveness.ALIVE
                and state.progress is Progress.PROGRESSING
                and not state.blocked_by
            )
            state.ages = self.clock
            due = verdicts.advanced(self, state, now)
            if due is not None:
                if not as_counted:
                    self.tally.touch(state.rank)
                return [], due
        self.tally.touch(state.rank)
        return self._evaluate_rank(state, now), self._next_due(state)

    def recount(self, rank: int) -> None:
        self.tally.touch(rank)

    def rank_failed(self, rank: int) -> None:
        self.rank_errors += 1
        if self.rank_errors == 1 or self.rank_errors % 1000 == 0:
            logger.exception("rankguard rules: evaluating rank %d failed", rank)

    def _next_due(self, s: RankState) -> float:
        """The earliest monitor time at which evaluating rank ``s`` again could give
        another verdict without a new record (-inf: at every scan; inf: never): an
        ended rank's when it is held, else the earliest of its rank verdicts'
        (:meth:`RankVerdicts.due`)."""
        rec = s.record
        if rec is None or s.seen_at is None:
            return math.inf
        if rec.ended:  # held (a victim's end): at every scan, as a peer's end may come
            return -math.inf if s.held_until is not None else math.inf
        return self.rank_verdicts.due(self, s)

    def next_due(self) -> float | None:
        """When the next rank is due without a new record (monitor clock; None: none
        is): the monitor may scan then instead of waiting for its next interval."""
        return self._due.earliest()

    def failure_order(self, state: RankState) -> tuple[int, int]:
        """Which ended rank is the likelier cause, first: the agent's root cause, then a
        rank that raised its own error, then one that vanished (SIGKILL, hard crash),
        then one whose error says a peer went away (its collective broke because another
        rank died); each by the time of its end record."""
        rec = state.record
        if rec is None:
            return 0, 0
        info = rec.exit
        root = self.root_cause
        if not info and root is None:  # a live rank's record, most of a scan's: its time
            return 0, rec.wall_time_ns
        info = info or {}
        if root is not None and rec.ended and root[0] == state.rank and root[1] in (None, rec.pid):
            kind = -1
        elif info.get("vanished"):
            kind = 1
        elif peer_failure(info.get("error")):
            kind = 2
        else:
            kind = 0
        return kind, rec.wall_time_ns

    def _evaluate_rank(self, s: RankState, now: float) -> list[Finding]:
        """One rank's verdict now: exited, else its rank verdicts (process stale,
        heartbeats late, in a section, progress; then its GPU's health)."""
        rec = s.record
        assert rec is not None and s.seen_at is not None
        out: list[Finding] = []
        s.ages = self.clock  # its ages at this scan (the clock is at ``now``)
        s.late = False
        if rec.ended:
            self._exited(s, now, out)
            return out
        self.rank_verdicts.evaluate(self, s, now, out)
        return out

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
                self.tally.touch(s.rank)
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
        self._name_silent(t)
        found = self.finding(
            t, FindingType.PROCESS_TIMEOUT, Reason.UNRESPONSIVE, timeout, quiet, message=message
        )
        found.detail[NAMED_AT] = RUN_END if restart is None else restart
        out.append(found)
        s.held_until = None
        s.active.add(FindingType.PROCESS_EXITED)
        s.record = rec.with_exit(after_failure_of_rank=t.rank)
        return True

    def _name_silent(self, t: RankState) -> None:
        """Rank ``t``'s process is named lost before its heartbeat timeout ran out: stale
        from now on, its own timeout (still to come) naming nothing more."""
        self.tally.touch(t.rank)
        t.liveness, t.progress = Liveness.STALE, Progress.UNKNOWN
        t.stall, t.blocked_by, t.late = None, [], False
        t.named_silent = t.record
        t.active.add(FindingType.PROCESS_TIMEOUT)
        t.fired.add(FindingType.PROCESS_TIMEOUT)
        self._due.again(t.rank)

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

    # ---- findings (rankguard.monitor.verdicts.findings) --------------------------

    @staticmethod
    def _clear(s: RankState, *types: FindingType) -> None:
        clear(s, *types)

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
        fire(self.run_id, s, ftype, reason, timeout_s, observed_s, out, detail=detail)

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
        return rank_finding(self.run_id, s, ftype, reason, timeout_s, observed_s, message)


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
