"""Is the process there: its heartbeats past the process timeout (the heartbeat timeout,
or ``node_disk_full`` when its node's disk is full: its heartbeats cannot be written,
which says nothing about the process), or late (older than ``fresh_s``: a stopped or
swapping process, not judged on progress until its records come back). The heartbeat
timeout of a rank whose last record was inside a collective every rank joined, or
behind one its peers wait in, carries the hang's class (by that last record)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.findings import clear, fire
from rankguard.monitor.verdicts.stalls import attach_hang, silent_hang
from rankguard.rank.timeline import CHECKPOINT_PHASE
from rankguard.schema.findings import FindingType, Liveness, Progress, Reason

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding
    from rankguard.util.disk import DiskState

__all__ = ["HeartbeatsLate", "ProcessStale", "full_disk"]


class ProcessStale:
    """No heartbeat for the process timeout (the checkpoint timeout while saving): the
    heartbeat timeout, progress not judged (one cause, one finding); else the rank is
    alive and its earlier episode of either finding is over."""

    __slots__ = ()

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        rec = s.record
        hb_age = s.heartbeat_age_s
        assert rec is not None and hb_age is not None
        cadence = view.cadence
        ckpt = rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE  # evidence.checkpointing
        timeout = cadence.checkpoint_timeout_s if ckpt else cadence.process_timeout_s
        if hb_age <= timeout and s.named_silent is not rec:  # (named: see rules)
            s.liveness = Liveness.ALIVE
            if s.active:  # (most ranks have no finding: no call)
                clear(s, FindingType.PROCESS_TIMEOUT, FindingType.NODE_DISK_FULL)
            return False
        s.liveness = Liveness.STALE
        s.progress = Progress.UNKNOWN
        s.stall = None
        s.blocked_by = []
        s.culprits_gone_at = None
        clear(s, FindingType.PROGRESS_TIMEOUT)
        disk = full_disk(view, s, now, timeout)
        if disk is not None:
            fire(
                view.run_id,
                s,
                FindingType.NODE_DISK_FULL,
                Reason.DISK_FULL,
                timeout,
                hb_age,
                out,
                detail={"disk": disk.to_dict()},
            )
            return True
        clear(s, FindingType.NODE_DISK_FULL)
        fired = len(out)
        fire(view.run_id, s, FindingType.PROCESS_TIMEOUT, Reason.UNRESPONSIVE, timeout, hb_age, out)
        if len(out) > fired and (hang := silent_hang(view)) is not None:
            attach_hang(out[-1], hang)
        return True

    def due(self, view: JobView, s: RankState) -> float:
        rec, seen = s.record, s.seen_at
        assert rec is not None and seen is not None
        if s.liveness is not Liveness.ALIVE:
            return -math.inf  # stale (disk state, grace): at every scan
        cadence = view.cadence
        return seen + (
            cadence.checkpoint_timeout_s if rec.checkpoint_active else cadence.process_timeout_s
        )


class HeartbeatsLate:
    """Heartbeats late (older than ``fresh_s``) but not yet past the process timeout: a
    stopped or swapping process, not one alive and not progressing. Its progress is
    unknown and not judged; the heartbeat timeout names it if it does not come back, and
    a stall it caused in its peers is theirs to wait on."""

    __slots__ = ()

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        hb_age = s.heartbeat_age_s
        assert hb_age is not None
        if hb_age <= view.fresh_s:
            return False
        s.late = True
        s.progress = Progress.UNKNOWN
        s.stall = None
        s.blocked_by = []
        s.culprits_gone_at = None
        return True

    def due(self, view: JobView, s: RankState) -> float:
        assert s.seen_at is not None
        return math.inf if s.late else s.seen_at + view.fresh_s


def full_disk(view: JobView, s: RankState, now: float, grace_s: float) -> DiskState | None:
    """The full disk that explains why rank ``s`` is stale, if any: its node's disk is
    full, or it was and has had space for at most ``grace_s`` (the heartbeats resume
    within a publish interval) while the rank's episode is still open."""
    if FindingType.PROCESS_TIMEOUT in s.active or s.record is None:
        return None  # already reported (and acted on) as unresponsive
    known = view.disks.get(s.record.node_rank) or view.disks.get(None)
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
