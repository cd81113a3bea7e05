"""All ranks stop at the same step: the launcher decides, every rank obeys.

The launcher (node 0) picks a step S far enough ahead that every rank sees the decision
before reaching it (the fastest rank's step plus the steps it runs in a couple of
heartbeat intervals), writes ``control.json`` (``stop_at_step``) into every node's run
directory (node 0 directly, other nodes through the store and their relay), and each
rank's heartbeat thread reads it. The training loop asks ``rg.should_stop()`` at each
step boundary, an attribute comparison: at step S every rank checkpoints the same
step and exits cleanly. No collective on any step. Straggler detection
(``stop_if_detected``) uses it; preemption will too.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rankguard._fs import atomic_write_json

__all__ = ["CONTROL_FILE", "ControlReader", "choose_stop_step", "write_control"]

CONTROL_FILE = "control.json"


def choose_stop_step(
    progress_by_rank: dict[int, int], step_time_s: float | None, lead_time_s: float
) -> int:
    """The first step every rank can still reach after hearing of the decision."""
    furthest = max(progress_by_rank.values(), default=0)
    margin = math.ceil(lead_time_s / step_time_s) if step_time_s and step_time_s > 0 else 10
    return furthest + max(2, margin)


def write_control(run_dir: Path, stop_at_step: int, reason: str) -> dict[str, Any]:
    control = {
        "schema_version": 1,
        "stop_at_step": stop_at_step,
        "reason": reason,
        "requested_wall_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(Path(run_dir) / CONTROL_FILE, control)
    return control


class ControlReader:
    """Rank side, heartbeat thread: notice a new ``control.json`` (one stat a beat)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / CONTROL_FILE
        self._mtime = 0.0
        self.stop_at_step: int | None = None
        self.reason: str | None = None

    def poll(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            control = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # replaced atomically: a bad read is retried next beat
        self._mtime = mtime
        if not isinstance(control, dict):
            return
        step = control.get("stop_at_step")
        if isinstance(step, int):
            self.stop_at_step = step
            self.reason = str(control.get("reason"))
