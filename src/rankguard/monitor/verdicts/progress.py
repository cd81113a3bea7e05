"""Fresh heartbeats: progressing, or stalled past the progress timeout of its phase
(setup before the first step, step in train, checkpointing while saving, eval's or the
progress timeout otherwise). A stall is not a finding yet: :mod:`stalls` names its
culprit among the stalled ranks."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.evidence import (
    TRAIN_PHASES,
    busy,
    own_timeout,
    stall_age,
)
from rankguard.monitor.verdicts.findings import clear
from rankguard.rank.timeline import CHECKPOINT_PHASE
from rankguard.schema.findings import FindingType, Progress

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["ProgressTimeout"]


class ProgressTimeout:
    """Settles every live, fresh rank not judged by a section timeout."""

    __slots__ = ()

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        rec = s.record
        assert rec is not None
        cadence = view.cadence
        started = rec.progress_seq > 0
        phase = rec.phase or ""
        age = s.progress_age_s
        if rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE:  # evidence.checkpointing
            timeout = cadence.checkpointing_timeout_s
        elif not started and not busy(s):  # an evaluation before step 1 is an evaluation
            timeout = cadence.setup_timeout_s
        elif phase in TRAIN_PHASES:
            timeout = cadence.step_timeout_s
        else:
            timeout = own_timeout(cadence, phase)
        if age is not None:
            age = stall_age(s, rec, now, age)
        active = s.active  # (most ranks have no finding: no call)
        if active:
            clear(s, FindingType.SECTION_TIMEOUT)
        if age is not None and age > timeout:
            s.progress = Progress.STALLED
            s.stall = (timeout, age)  # attributed by the stall verdict
        else:
            s.progress = Progress.PROGRESSING if started else Progress.STARTING
            s.stall = None
            s.blocked_by = []
            s.culprits_gone_at = None
            if active:
                clear(s, FindingType.PROGRESS_TIMEOUT)
        return True

    def due(self, view: JobView, s: RankState) -> float:
        """When the progress age reaches the shortest progress timeout in force (while
        not stalled: once across, the verdict stays until the next record)."""
        rec, seen = s.record, s.seen_at
        assert rec is not None and seen is not None
        since = rec.since_progress_s
        if since is None or s.stall is not None:
            return math.inf
        return seen - since + view.cadence.shortest_progress_timeout_s
