"""All ranks stop at the same step: the launcher decides, every rank obeys.

The launcher (node 0) picks a step S far enough ahead that every rank sees the decision
before reaching it (the fastest rank's step plus the steps it runs in a couple of
heartbeat intervals), writes ``control.json`` (``stop_at_step``) into every node's run
directory (node 0 directly, other nodes through the store and their relay), and each
rank's heartbeat thread reads it. The training loop asks ``rg.should_stop()`` at each
step boundary, an attribute comparison: at step S every rank checkpoints the same
step and exits cleanly. No collective on any step. Straggler detection
(``stop_if_detected``) uses it; preemption will too.

A stop step counts the training steps this run's processes issued (saves left out),
not the script's own step numbers (a resumed run starts counting at 0 again):
:func:`script_offset` finds the script's numbering from the ranks' heartbeats (their
last save's step and the training steps it covered, or the iteration they show), and
:func:`stop_words` says a stop step in both, never one for the other. A rank that left
at the request says so in its ``process_end`` (``exit.stopped_at``);
:func:`finished_before_stop` tells a job whose ranks all finished training before the
stop step (it completed) from one that stopped.
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
from rankguard.schema.blocks import (
    CheckpointBlock,
    ExitBlock,
    PerfBlock,
    PreemptBlock,
    exit_clean,
    read_block,
)
from rankguard.schema.findings import Finding, FindingType
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import CONTROL_FILE
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.statusblocks import StopRequestedBlock, stop_words
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
    "finished_before_stop",
    "script_offset",
    "stop_words",
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


def _rank_offset(rec: HeartbeatRecord) -> int | None:
    """The script's step minus this run's training steps for one rank: from its last
    completed save (the script's step it named, the training steps it covered), else
    from the iteration it shows when that is the script's or a resumed checkpoint's
    numbering; None when the heartbeat does not tell."""
    try:
        pre = read_block(rec, PreemptBlock)
    except ValueError:
        pre = None
    if pre is not None and pre.saved_step is not None and pre.saved_seq is not None:
        return pre.saved_step - pre.saved_seq
    if rec.iteration is not None and rec.iteration_source in ("script", "checkpoint"):
        steps = rec.progress_seq - _checkpoints(rec)
        if steps > 0:
            return rec.iteration - steps
    return None


def script_offset(records: list[HeartbeatRecord]) -> int | None:
    """What to add to a stop step (training steps of this run) to get the script's
    step number: one offset every rank that tells agrees on, else None (unknown: no
    rank tells, or they disagree)."""
    offsets = {o for rec in records if (o := _rank_offset(rec)) is not None}
    return offsets.pop() if len(offsets) == 1 else None


def _not_finished(rec: HeartbeatRecord) -> bool:
    """``rec``'s end does not show a rank that finished training: it left at the stop
    request (``exit.stopped_at``), or it got the preemption signal in a script that
    never asks ``should_stop()`` (it may have left at the signal on its own)."""
    try:
        end = read_block(rec, ExitBlock)
        pre = read_block(rec, PreemptBlock)
    except ValueError:
        return True  # an end that cannot be read proves no finished training
    if end is None or end.vanished or end.stopped_at is not None:
        return True
    return pre is not None and pre.signal_received and not pre.asks_stop


def finished_before_stop(records: list[HeartbeatRecord], world: int | None = None) -> bool:
    """Every rank (``world`` of them, when known) ended on its own: its own clean
    ``process_end`` (exit code 0) that does not say it left at the stop request. The
    training ended before the agreed stop step (or, for a straggler's stop, the script
    never asks ``should_stop()``): the job completed, there is nothing to resume. A
    rank that got the preemption signal counts only if its script asks
    ``should_stop()``: one that never asks may have left at the signal with a save of
    its own, and its job is preempted (a requeue), not completed."""
    if not records or (world is not None and len(records) < world):
        return False
    return all(
        rec.own_end
        and exit_clean(rec)
        and (rec.exit or {}).get("exit_code") in (None, 0)
        and not _not_finished(rec)
        for rec in records
    )


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
        self.script_step: int | None = None  # the stop step in the script's numbering
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
        offset = script_offset(records)
        self.script_step = self.stop_at + offset if offset is not None else None
        self.reason = reason
        write_control(self.run_dir, self.stop_at, reason)
        if self.publish is not None:
            self.publish(self.stop_at, reason)
        logger.warning(
            "rankguard: all ranks stop %s: %s", stop_words(self.stop_at, self.script_step), reason
        )
        return self.stop_at

    def status_fields(self) -> dict[str, StopRequestedBlock]:
        if self.stop_at is None:
            return {}
        block = StopRequestedBlock(self.stop_at, self.reason, self.script_step)
        return {StopRequestedBlock.name: block}


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
