"""Cross-rank step times from the heartbeats (node 0's monitor), without a collective.

Every rank's heartbeat carries its last performance windows ``[step, iteration,
step_time_ms]``. Once every rank has reported a window, or once no rank can report it
any more (all have moved past it), one line goes to ``perf_ranks.jsonl``: min, median
and max step time over ranks, the slowest and fastest rank and every rank's value (the
report's heatmap). In a synchronous job these are close by construction; the
difference shows where time is spent waiting.
"""

from __future__ import annotations

import math
import statistics

from rankguard.schema.blocks import PerfBlock
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import PERF_RANKS_FILE

__all__ = ["PERF_RANKS_FILE", "PerfRanks"]


class PerfRanks:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._windows: dict[int, dict[int, float]] = {}
        self._iterations: dict[int, int] = {}
        self._max_done = 0
        self._latest_step: dict[int, int] = {}
        self.latest: JsonObject | None = None

    def add(self, rank: int, perf: PerfBlock) -> int:
        """Take a rank's heartbeat ``perf`` block; returns its latest step."""
        latest = perf.step or 0
        if latest < self._latest_step.get(rank, 0):
            self._restart()  # the rank's process was replaced: its steps count anew
        self._latest_step[rank] = latest
        for window in perf.windows:
            step, ms = window.step, window.step_time_ms
            if step <= self._max_done or not math.isfinite(ms):
                continue
            self._windows.setdefault(step, {})[rank] = ms
            if window.iteration is not None:
                self._iterations[step] = window.iteration
        return latest

    def _restart(self) -> None:
        self._windows.clear()
        self._iterations.clear()
        self._max_done = 0
        self._latest_step.clear()

    def complete(self, world_size: int, latest_step_by_rank: dict[int, int]) -> list[dict]:
        """Windows every rank reported, or that no rank can still report."""
        floor = min(latest_step_by_rank.values(), default=0)
        out = []
        for step in sorted(self._windows):
            by_rank = self._windows[step]
            if len(by_rank) < world_size and step >= floor:
                continue
            out.append(self._line(step, by_rank, world_size))
            self._max_done = max(self._max_done, step)
            del self._windows[step]
            self._iterations.pop(step, None)
        if out:
            self.latest = out[-1]
        return out

    def _line(self, step: int, by_rank: dict[int, float], world_size: int) -> JsonObject:
        values = list(by_rank.values())
        slowest = max(by_rank, key=by_rank.__getitem__)
        fastest = min(by_rank, key=by_rank.__getitem__)
        return {
            "schema_version": 1,
            "run_id": self.run_id,
            "step": step,
            "iteration": self._iterations.get(step),
            "n_ranks": len(by_rank),
            "world_size": world_size,
            "step_time_ms": {
                "min": round(min(values), 3),
                "median": round(statistics.median(values), 3),
                "max": round(max(values), 3),
            },
            "slowest_rank": slowest,
            "fastest_rank": fastest,
            "by_rank": {str(r): round(v, 3) for r, v in sorted(by_rank.items())},
        }
