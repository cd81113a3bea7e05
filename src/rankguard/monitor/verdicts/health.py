"""The GPU health of a live rank's device, from its node's health snapshot (a stale
snapshot says nothing): ``health_failure`` when unhealthy, ``health_warning`` on a
warning. A new snapshot marks the node's ranks due (``HeartbeatRules.mark_node``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rankguard.monitor.verdicts.findings import clear, fire
from rankguard.schema.findings import FindingType, Reason

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.monitor.verdicts.api import JobView
    from rankguard.schema.findings import Finding

__all__ = ["GpuHealth"]


class GpuHealth:
    """A check of every live rank (it settles nothing)."""

    __slots__ = ()

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        health = s.gpu_health
        if not health and not s.active:  # nothing known, nothing to clear: no call
            return False
        health = health or {}
        verdict = None if health.get("stale") else health.get("health")
        if verdict == "unhealthy":
            fire(view.run_id, s, FindingType.HEALTH_FAILURE, Reason.GPU_UNHEALTHY, None, None, out)
        else:
            clear(s, FindingType.HEALTH_FAILURE)
        if verdict == "warning":
            fire(view.run_id, s, FindingType.HEALTH_WARNING, Reason.GPU_WARNING, None, None, out)
        else:
            clear(s, FindingType.HEALTH_WARNING)
        return False

    def due(self, view: JobView, s: RankState) -> float:
        return math.inf  # changes with the node's snapshot, which marks the rank due
