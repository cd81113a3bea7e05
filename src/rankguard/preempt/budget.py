"""Does a save fit the grace window?

After the exit signal the ranks first run on to the agreed stop step, then save. The
first part (:meth:`rankguard.schema.cadence.Cadence.agreement_lead_s`) is about three monitor
scans plus a second when node 0 reads every rank's progress fresh (one node, or a shared
filesystem: each signalled rank publishes a heartbeat at once), and up to three
heartbeat intervals and three scans plus two seconds when other nodes' records come
through the store relays (pushed once per heartbeat interval). Both parts
must fit in ``preempt_time``:

    lead_s + save_s <= preempt_time

``save_s`` is the longest save measured (``session.checkpoint()`` blocks: the stage and
the write of a blocking save, the stage alone of an async one, whose write the exit then
waits for), taken from the ranks' heartbeats during the run and, at start, from the
previous run (``preempt_state.json`` next to ``ft_state.json``). When it does not fit,
the launcher says so at start and ``rankguard status`` shows it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rankguard.schema.statusblocks import PreemptBudget
from rankguard.util.fs import atomic_write_json

__all__ = ["GraceBudget", "load_save_time", "store_save_time"]


class GraceBudget:
    def __init__(self, preempt_time: float, lead_s: float, save_s: float | None = None) -> None:
        self.preempt_time = preempt_time
        self.lead_s = lead_s
        self.save_s = save_s  # longest save known (previous run, then this one)
        self.source = "previous run" if save_s is not None else None

    def observe(self, save_s: Any) -> None:
        if not isinstance(save_s, (int, float)) or not math.isfinite(save_s) or save_s < 0:
            return
        if self.source != "this run" or self.save_s is None or save_s > self.save_s:
            self.save_s = float(save_s)
            self.source = "this run"

    def needed_s(self) -> float | None:
        return None if self.save_s is None else self.lead_s + self.save_s

    def fits(self) -> bool:
        needed = self.needed_s()
        return needed is None or needed <= self.preempt_time

    def warning(self) -> str:
        return (
            f"preemption: a save does NOT fit the grace window: the stop step comes up to "
            f"{self.lead_s:.1f}s after the signal and the longest save ({self.source}) took "
            f"{self.save_s:.1f}s, {self.needed_s():.1f}s > preempt_time={self.preempt_time:g}s. "
            "Raise preemption.preempt_time (and Slurm's --signal time), save faster (async), "
            "or lower heartbeat.publish_interval_s"
        )

    def block(self) -> PreemptBudget:
        """The budget as ``status.json``'s ``preemption.budget``."""
        return PreemptBudget(
            preempt_time_s=self.preempt_time,
            lead_s=round(self.lead_s, 3),
            save_s=None if self.save_s is None else round(self.save_s, 3),
            save_source=self.source,
            fits=self.fits(),
        )


def load_save_time(path: Path) -> float | None:
    """The previous run's longest save from ``preempt_state.json``, or None."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8")).get("save_max_s")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) if value >= 0 else None
    return None


def store_save_time(path: Path, budget: GraceBudget) -> None:
    """Keep this run's longest save for the next run's check at start."""
    if budget.source != "this run" or budget.save_s is None:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(path), {"schema_version": 1, "save_max_s": budget.save_s})
