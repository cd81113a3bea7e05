"""A phase with a section timeout of its own (NVRx's ``rank_section_timeouts``: a named
section, or any phase with the out-of-section timeout) is judged by how long it has
lasted, not by progress; setup, train and saves (an evaluation before the first step
too) are left to :mod:`~rankguard.monitor.verdicts.progress`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.evidence import (
    TRAIN_PHASES,
    busy,
    checkpointing,
    standby_wait,
)
from rankguard.monitor.verdicts.findings import clear, fire
from rankguard.rank.timeline import EVAL_PHASE, RESTART_PHASE
from rankguard.schema.findings import FindingType, Progress, Reason

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["SectionTimeout"]


class SectionTimeout:
    """``section_timeout`` when the phase outlasts its timeout; a rank in such a phase
    is progressing as far as the progress timeout goes."""

    __slots__ = ()

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        rec = s.record
        hb_age = s.heartbeat_age_s
        assert rec is not None and hb_age is not None
        if (
            rec.phase in TRAIN_PHASES
            or checkpointing(rec)
            or (rec.progress_seq <= 0 and not busy(s))
        ):
            return False
        cadence = view.cadence
        sections = cadence.sections
        phase = rec.phase or ""
        if phase == EVAL_PHASE and EVAL_PHASE not in sections and cadence.out_of_section_s is None:
            return False  # eval_timeout_s, a progress timeout
        timeout = sections.get(phase, cadence.out_of_section_s)
        if timeout is None:
            return False
        if phase == RESTART_PHASE:
            timeout = max(timeout, standby_wait(rec))
        elapsed = (rec.phase_elapsed_s or 0.0) + hb_age
        if elapsed > timeout:
            reason = Reason.SECTION_EXCEEDED if phase in sections else Reason.OUT_OF_SECTION
            fire(view.run_id, s, FindingType.SECTION_TIMEOUT, reason, timeout, elapsed, out)
        else:
            clear(s, FindingType.SECTION_TIMEOUT)
        s.progress = Progress.PROGRESSING
        s.stall = None
        s.blocked_by = []
        clear(s, FindingType.PROGRESS_TIMEOUT)
        return True

    def due(self, view: JobView, s: RankState) -> float:
        """When the phase's age reaches the shortest timeout in force (outside train)."""
        rec, seen = s.record, s.seen_at
        assert rec is not None and seen is not None
        if rec.phase in TRAIN_PHASES or FindingType.SECTION_TIMEOUT in s.active:
            return math.inf
        return seen - (rec.phase_elapsed_s or 0.0) + view.cadence.shortest_progress_timeout_s
