"""Section durations a rank measured, for learned timeouts (``calc_ft_timeouts``).

Read from the progress tracker's step timeline by the heartbeat thread, never on the hot
path: the longest step after warm-up (an interval holding an evaluation or a save
is no step), the longest checkpoint save, the set-up time
(start to the first step) and the longest gap between two heartbeat records. Node 0's
monitor takes the maximum over ranks; the launcher turns it into timeouts at the end
of the run (:mod:`rankguard.ft.learned`).
"""

from __future__ import annotations

from rankguard.rank.timeline import RING_SIZE, ProgressTracker
from rankguard.schema.jsontypes import JsonObject

__all__ = ["SectionStats"]

_MASK = RING_SIZE - 1
WARMUP_STEPS = 3


class SectionStats:
    def __init__(self, tracker: ProgressTracker) -> None:
        self.tracker = tracker
        self.step_max_s = 0.0
        self.steps = 0
        self.ckpt_max_s = 0.0
        self.ckpts = 0
        self.setup_s: float | None = None
        self.hb_gap_max_s = 0.0
        self._seen = 0
        self._ckpt_seen = 0
        self._last_record_ns: int | None = None

    def update(self) -> None:
        t = self.tracker
        issued = t.issued_seq
        ring = t.step_ns
        non_steps = set(t.non_step_seqs)
        start = max(self._seen + 1, issued - RING_SIZE + 2)
        for seq in range(start, issued + 1):
            if seq in non_steps:
                continue
            if seq == 1 and self.setup_s is None:
                self.setup_s = (ring[1] - t.started_ns) / 1e9
            if seq > WARMUP_STEPS and (seq - 1) not in non_steps:
                prev_ns, end_ns = ring[(seq - 1) & _MASK], ring[seq & _MASK]
                if t.interval_in_other_phase(prev_ns, end_ns):
                    continue  # an evaluation or a save between two steps: not a step
                self.step_max_s = max(self.step_max_s, (end_ns - prev_ns) / 1e9)
                self.steps += 1
        self._seen = max(self._seen, issued)
        for duration_ns in t.checkpoint_durations_ns[self._ckpt_seen :]:
            self._ckpt_seen += 1
            self.ckpts += 1
            self.ckpt_max_s = max(self.ckpt_max_s, duration_ns / 1e9)
        now = t.now_ns()
        if self._last_record_ns is not None:
            self.hb_gap_max_s = max(self.hb_gap_max_s, (now - self._last_record_ns) / 1e9)
        self._last_record_ns = now

    def heartbeat_fields(self) -> JsonObject:
        self.update()
        return {
            "ft_stats": {
                "setup_s": self.setup_s,
                "step_max_s": round(self.step_max_s, 6),
                "steps": self.steps,
                "ckpt_max_s": round(self.ckpt_max_s, 6),
                "ckpts": self.ckpts,
                "hb_gap_max_s": round(self.hb_gap_max_s, 6),
            }
        }
