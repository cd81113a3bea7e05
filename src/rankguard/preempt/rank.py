"""Rank side of preemption: the exit-signal flag, the launcher told, the save measured.

The signal usually reaches the rank from its launcher (which forwards it) and the stop
step from node 0 (``control.json``, :mod:`rankguard.monitor.agree`). A signal sent straight to
one rank instead (``kill PID``) is passed on to the rank's launcher, at the loop's next
question (never from the handler itself), and from there the job is preempted as a
whole: every rank then saves the same step.

Heartbeats carry ``preempt``: whether the signal came, how long this rank's saves
took (``session.checkpoint()`` blocks, the last and the longest), which node 0 compares
with ``preempt_time`` (the grace budget), and the last save the rank completed
(``session.note_saved``: its step and the training steps it covers), on which node 0's
"every rank saved the stop step" rests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

from rankguard.preempt.config import PreemptionConfig
from rankguard.preempt.handler import ExitSignalHandler
from rankguard.preempt.saver import set_save_listener
from rankguard.rank.timeline import RING_SIZE, ProgressTracker
from rankguard.schema.blocks import PreemptBlock

__all__ = ["RankPreemption"]

logger = logging.getLogger(__name__)

_MASK = RING_SIZE - 1

CONTROL_POLL_S = 0.05
"""After the signal, how often the loop itself looks for the agreed stop step."""

TELL_LAUNCHER_AFTER_S = 1.0
"""No stop step this long after the signal: it did not come through the launcher (which
agrees on a step at once), so the rank passes it on."""


class RankPreemption:
    def __init__(
        self,
        cfg: PreemptionConfig,
        tracker: ProgressTracker,
        *,
        launcher_pid: int | None = None,
        rank: int = 0,
    ) -> None:
        self.cfg = cfg
        self.tracker = tracker
        self.launcher_pid = launcher_pid
        self.rank = rank  # the global rank (RunEnv's): rank 0 says the one line
        self.handler = ExitSignalHandler(cfg.signum)
        self.launcher_told = False
        self.reported = False  # a heartbeat was asked for right after the signal
        self._last_poll = 0.0
        self._first_seen: float | None = None
        self._said_unregistered = False

    def install(self) -> bool:
        set_save_listener(self.tracker)  # TorchFileSaver, save_and_wait: saves noted here
        installed = self.handler.install()
        if not installed:
            logger.warning(
                "rankguard: preemption: the %s handler can only be installed on the main "
                "thread; this rank will not save on preemption",
                self.cfg.signum.name,
            )
        return installed

    def release(self) -> None:
        previous = set_save_listener(None)
        if previous is not None and previous is not self.tracker:
            set_save_listener(previous)  # another rank's (threads as ranks): left as it was
        self.handler.release()

    @property
    def received(self) -> bool:
        return self.handler.received

    def after_signal(self, stop_known: bool) -> bool:
        """Called by the loop (slow path, signal received): tell the launcher once if
        no stop step came; True when it is time to look for it again (rate-limited)."""
        now = time.monotonic()
        if self._first_seen is None:
            self._first_seen = now
        late = now - self._first_seen >= TELL_LAUNCHER_AFTER_S
        if late and not stop_known and not self.launcher_told:
            self.launcher_told = True
            self._tell_launcher()
        if now - self._last_poll < CONTROL_POLL_S:
            return False
        self._last_poll = now
        return True

    def _tell_launcher(self) -> None:
        # The launcher ignores a repeat of a signal it already acts on: harmless when it
        # was the launcher that forwarded this one.
        pid = self.launcher_pid
        if pid is None or pid <= 1:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, self.cfg.signum)

    def step_min_s(self, window: int = 16) -> float | None:
        """The shortest of the last ``window`` steps (checkpoints left out): how far
        ahead node 0 puts the stop step (:func:`rankguard.monitor.agree.fastest_step_s`)."""
        t = self.tracker
        issued = t.issued_seq
        ring = t.step_ns
        skip = set(t.non_step_seqs)
        gaps = [
            ring[seq & _MASK] - ring[(seq - 1) & _MASK]
            for seq in range(max(2, issued - window + 1), issued + 1)
            if seq not in skip and seq - 1 not in skip
        ]
        positive = [g for g in gaps if g > 0]
        return min(positive) / 1e9 if positive else None

    def notify(self, callback: Callable[[int], None]) -> None:
        """``callback(signum)`` from the signal handler when the signal comes (it must
        only set flags): the session's fast path wakes up."""
        self.handler.on_signal = callback

    def unregistered_line(self) -> str | None:
        """Once, from the second training step on: the line that says preemption is on
        but the script never asked ``should_stop()``, so a preemption signal ends the
        ranks without a save (the handler falls through to the signal's default); None
        when the script asks, before that step, and after it was said."""
        t = self.tracker
        if self._said_unregistered or t.issued_seq - t.checkpoint_count < 2:
            return None
        self._said_unregistered = True
        if self.handler.listening or not self.handler.installed:
            return None
        return (
            f"preemption on (preemption.enable_exit_handler, {self.cfg.signum.name}), but "
            "the script saves nothing: it never asks rg.should_stop(), so a preemption "
            "ends the ranks without a save and the next run starts from the last "
            "checkpoint the script wrote, if any"
        )

    def heartbeat_block(self) -> PreemptBlock:
        """The ``preempt`` block of this rank's heartbeat records (and, on rank 0, the
        one line of :meth:`unregistered_line`: the heartbeat thread, never the loop)."""
        line = self.unregistered_line()
        if line is not None and self.rank == 0:
            logger.warning("rankguard: %s", line)
        durations = list(self.tracker.checkpoint_durations_ns)
        step = self.step_min_s()
        saved = self.tracker.saved  # one read: a background commit may replace it
        return PreemptBlock(
            signal_received=self.handler.received,
            asks_stop=self.handler.listening,
            step_min_s=round(step, 6) if step is not None else None,
            save_last_s=round(durations[-1] / 1e9, 6) if durations else None,
            save_max_s=round(max(durations) / 1e9, 6) if durations else None,
            saved_step=saved[0] if saved is not None else None,
            saved_seq=saved[1] if saved is not None else None,
        )
