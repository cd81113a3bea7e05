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
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rankguard.monitor.api import FindingSink
from rankguard.schema.blocks import CheckpointBlock, PerfBlock, PreemptBlock, read_block
from rankguard.schema.findings import Finding, FindingType
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import CONTROL_FILE
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.statusblocks import StopRequestedBlock
from rankguard.util.fs import atomic_write_json

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState
    from rankguard.schema.cadence import Cadence

__all__ = [
    "CONTROL_FILE",
    "ControlReader",
    "StopAgreement",
    "choose_stop_step",
    "fastest_step_s",
    "write_control",
]

logger = logging.getLogger(__name__)


def choose_stop_step(
    progress_by_rank: dict[int, int], step_time_s: float | None, lead_time_s: float
) -> int:
    """The first step every rank can still reach after hearing of the decision."""
    furthest = max(progress_by_rank.values(), default=0)
    margin = math.ceil(lead_time_s / step_time_s) if step_time_s and step_time_s > 0 else 10
    return furthest + max(2, margin)


def fastest_step_s(records: list[HeartbeatRecord]) -> float | None:
    """The shortest recent step time any rank shows (the latest perf window, or the
    average since the first step), so a stop step is far enough ahead for all."""
    times = []
    for rec in records:
        try:
            perf = read_block(rec, PerfBlock)
        except ValueError:  # not an object: no perf window
            perf = None
        if perf is not None and perf.step_time_ms is not None:
            times.append(float(perf.step_time_ms) / 1e3)
        try:
            pre = read_block(rec, PreemptBlock)
        except ValueError:  # a malformed block: the phase's average below
            pre = None
        measured = pre.step_min_s if pre is not None else None
        if measured is not None:
            # the rank's own shortest recent step: the phase's average below is wrong
            # after a checkpoint (the phase restarts, its elapsed time does not cover seq)
            times.append(float(measured))
            continue
        seq, elapsed = rec.progress_seq, rec.phase_elapsed_s
        if rec.phase == "train" and seq > 0 and elapsed:
            times.append(elapsed / seq)
    positive = [t for t in times if t > 0 and math.isfinite(t)]
    return min(positive) if positive else None


def _checkpoints(rec: HeartbeatRecord) -> int:
    """How many of ``rec``'s progress steps were saves (``checkpoint_count``)."""
    try:
        block = read_block(rec, CheckpointBlock)
    except ValueError:
        return 0
    return block.saves_in(rec.progress_seq) if block is not None else 0


class StopAgreement(FindingSink):
    """Node 0: decide the one step every rank stops at, and tell every node.

    A finding sink (a straggler finding with ``stop_if_detected`` asks for a stop) and a
    status source (``stop_requested`` in ``status.json``). ``publish`` tells the other
    nodes (their relays write ``control.json`` for their ranks)."""

    def __init__(
        self,
        run_dir: Path,
        cadence: Cadence,
        ranks: Callable[[], Mapping[int, RankState]],
        *,
        publish: Callable[[int, str], None] | None = None,
        stop_on_straggler: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.cadence = cadence
        self.ranks = ranks
        self.publish = publish
        self.stop_on_straggler = stop_on_straggler
        self.stop_at: int | None = None
        self.reason: str | None = None

    def after_write(self, finding: Finding) -> None:
        if (
            finding.finding_type is FindingType.STRAGGLER
            and self.stop_at is None
            and self.stop_on_straggler()  # stop_if_detected decides, in the detector
        ):
            self.request_stop(f"straggler: {finding.message}")

    def request_stop(self, reason: str, lead_s: float | None = None) -> int:
        """Choose and publish the stop step. ``lead_s``: how long every rank may take to
        hear of it, from the progress the monitor knows (default:
        :attr:`Cadence.stop_lead_s`; less when the records are fresh)."""
        ranks = self.ranks()
        records = [s.record for s in ranks.values() if s.record is not None]
        # in training steps: a rank that saved more often has more progress, not more
        # steps (every rank counts its way to the same stop step)
        progress = {r.rank: r.progress_seq - _checkpoints(r) for r in records}
        lead = self.cadence.stop_lead_s if lead_s is None else lead_s
        self.stop_at = choose_stop_step(progress, fastest_step_s(records), lead)
        self.reason = reason
        write_control(self.run_dir, self.stop_at, reason)
        if self.publish is not None:
            self.publish(self.stop_at, reason)
        logger.warning("rankguard: all ranks stop at step %d: %s", self.stop_at, reason)
        return self.stop_at

    def status_fields(self) -> dict[str, StopRequestedBlock]:
        if self.stop_at is None:
            return {}
        return {StopRequestedBlock.name: StopRequestedBlock(self.stop_at, self.reason)}


def write_control(run_dir: Path, stop_at_step: int, reason: str) -> JsonObject:
    control: JsonObject = {
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
