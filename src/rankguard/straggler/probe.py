"""Rank side: how long the rank's own work takes, not its waiting.

In a data-parallel job every rank's step time equals the slowest rank's: the gradient
all-reduce makes the fast ranks wait. So the probe measures the CPU time of the
training thread (``time.thread_time``): a rank blocked in a collective, in a sleep or
on a lock uses none, a rank computing uses it all, and oversubscribed cores do not
inflate it. By default a step's CPU time is taken from one step end to the next; with
``with rg.compute():`` around the rank's own compute (forward and backward up to the
first collective) only that is counted. On GPU, where the CPU only queues kernels, the
compute section is the thing to mark (the CUDA-event variant is future work).

Cost: only when straggler detection is on: one ``thread_time_ns`` per measured step
(every ``profiling_interval``-th) and a store into a ring buffer. The heartbeat thread
publishes the median of the samples since the last record (``straggler`` field).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ComputeProbe"]

_RING = 4096


class ComputeProbe:
    __slots__ = (
        "_every",
        "_inner",
        "_last_cpu",
        "_n",
        "_read",
        "_section_cpu",
        "_section_t0",
        "_sections",
        "_write",
        "ring",
    )

    def __init__(self, step_end: Callable[[int | None], None], *, every: int = 1) -> None:
        self._inner = step_end
        self._every = every
        self._n = 0
        self._last_cpu = time.thread_time_ns()
        self._section_t0 = 0
        self._section_cpu = 0
        self._sections = False
        self.ring = [0.0] * _RING
        self._write = 0
        self._read = 0

    # ---- training thread -------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        self._inner(iteration)
        n = self._n = self._n + 1
        if self._sections:
            if n % self._every == 0 and self._section_cpu:
                # one sampled step's compute section (see section_enter)
                self.ring[self._write % _RING] = self._section_cpu / 1e6
                self._write += 1
                self._section_cpu = 0
            return
        if n % self._every:
            return
        now = time.thread_time_ns()
        # the CPU time of the last `every` steps, published per step
        self.ring[self._write % _RING] = (now - self._last_cpu) / 1e6 / self._every
        self._last_cpu = now
        self._write += 1

    def section_enter(self) -> None:
        # Only the compute of a step that will be sampled is timed (profiling_interval).
        self._sections = True
        if (self._n + 1) % self._every == 0:
            self._section_t0 = time.thread_time_ns()
        else:
            self._section_t0 = 0

    def section_exit(self) -> None:
        if self._section_t0:
            self._section_cpu += time.thread_time_ns() - self._section_t0

    # ---- heartbeat thread ------------------------------------------------------------

    def heartbeat_fields(self) -> dict[str, Any] | None:
        write = self._write
        start = max(self._read, write - _RING)
        if write <= start:
            return None
        samples = [self.ring[i % _RING] for i in range(start, write)]
        self._read = write
        return {
            "straggler": {
                "compute_ms": round(statistics.median(samples), 4),
                "samples": len(samples),
                "method": "compute_section_cpu" if self._sections else "step_cpu",
            }
        }
