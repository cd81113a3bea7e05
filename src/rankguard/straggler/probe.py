"""Rank side: how long the rank's own work takes, not its waiting.

In a data-parallel job every rank's step time equals the slowest rank's: the gradient
all-reduce makes the fast ranks wait. So the probe times only what the rank itself
spends:

* CPU ranks: the CPU time of the training thread (``time.thread_time``). A rank blocked
  in a collective, in a sleep or on a lock uses none, a rank computing uses it all, and
  oversubscribed cores do not inflate it. By default a step's CPU time is taken from one
  step end to the next; with ``with rg.compute():`` around the rank's own compute
  (forward and backward up to the first collective) only that is counted.
* GPU ranks (CUDA initialised when the first compute section opens): two timing CUDA
  events recorded on the current stream around each ``rg.compute()`` section. Recording
  is asynchronous (no device synchronisation); the heartbeat thread reads the elapsed
  device time once the end event's ``query()`` is true. Several sections in one step are
  summed. Without a marked section a GPU rank falls back to the CPU method, which there
  times kernel launches, not the device: the probe says so once, loudly.

Cost: only when straggler detection is on and only on sampled steps (every
``profiling_interval``-th): one ``thread_time_ns`` (CPU) or two ``Event.record`` calls
(GPU) and a store into a ring buffer. The heartbeat thread publishes the median of the
samples since the last record (``straggler`` field).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from rankguard.rank.timeline import cuda_in_use
from rankguard.schema.jsontypes import JsonObject

__all__ = ["ComputeProbe"]

logger = logging.getLogger(__name__)

_RING = 4096
# CUDA event pairs reused round-robin. The heartbeat thread reads a pair only while it is
# at most half a pool behind the training thread, so a pair is never re-recorded while
# it is being read.
_POOL = 1024
_READ_WINDOW = _POOL // 2


def _timing_event() -> Any:
    import torch  # here, not at the top: `import rankguard` (light commands) stays torch-free

    return torch.cuda.Event(enable_timing=True)


class ComputeProbe:
    __slots__ = (
        "_cuda",
        "_event_factory",
        "_every",
        "_inner",
        "_last_cpu",
        "_n",
        "_pair_read",
        "_pair_step",
        "_pair_write",
        "_pairs",
        "_read",
        "_section_cpu",
        "_section_t0",
        "_sections",
        "_warned_gpu_without_sections",
        "_write",
        "ring",
    )

    def __init__(
        self,
        step_end: Callable[[int | None], None],
        *,
        every: int = 1,
        cuda: bool | None = None,
        event_factory: Callable[[], Any] | None = None,
    ) -> None:
        """``cuda``: time sections with CUDA events (True), thread CPU time (False), or
        decide when the first section opens (None: CUDA when it is initialised).
        ``event_factory`` makes a timing event (default ``torch.cuda.Event``; tests use
        a fake)."""
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
        self._cuda = cuda
        self._event_factory = event_factory or _timing_event
        self._pairs: list[tuple[Any, Any]] = []
        self._pair_step = [0] * _POOL
        self._pair_write = 0
        self._pair_read = 0
        self._warned_gpu_without_sections = False

    # ---- training thread -------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        self._inner(iteration)
        n = self._n = self._n + 1
        if self._sections:
            if self._cuda:
                return  # the heartbeat thread reads the event pairs
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
        if not self._sections:
            self._first_section()
        if (self._n + 1) % self._every:
            self._section_t0 = 0
        elif self._cuda:
            slot = self._pair_write % _POOL
            if slot == len(self._pairs):
                self._pairs.append((self._event_factory(), self._event_factory()))
            self._pairs[slot][0].record()
            self._pair_step[slot] = self._n
            self._section_t0 = 1
        else:
            self._section_t0 = time.thread_time_ns()

    # ``with probe:`` is ``with rg.compute():`` (no wrapper object: one call less each way)
    __enter__ = section_enter

    def section_exit(self) -> None:
        self.__exit__(None, None, None)

    def __exit__(self, *exc: object) -> None:
        if self._section_t0:
            if self._cuda:
                w = self._pair_write
                self._pairs[w % _POOL][1].record()
                self._pair_write = w + 1
                self._section_t0 = 0
            else:
                self._section_cpu += time.thread_time_ns() - self._section_t0

    def _first_section(self) -> None:
        self._sections = True
        if self._cuda is None:
            self._cuda = cuda_in_use()

    # ---- heartbeat thread ------------------------------------------------------------

    def _read_cuda_pairs(self) -> None:
        """Turn the completed steps' event pairs into samples (one sum per step)."""
        write = self._pair_write
        read = self._pair_read
        steps = self._pair_step
        if read < write - _READ_WINDOW:  # fell behind: skip to a whole step in the window
            read = write - _READ_WINDOW
            cut = steps[(read - 1) % _POOL]
            while read < write and steps[read % _POOL] == cut:
                read += 1
        current_step = self._n  # steps below this one have ended: no more sections
        while read < write:
            step = steps[read % _POOL]
            if step >= current_step:
                break
            end = read + 1
            while end < write and steps[end % _POOL] == step:
                end += 1
            if not self._pairs[(end - 1) % _POOL][1].query():
                break  # later pairs are later on the stream
            try:
                total = 0.0
                for i in range(read, end):
                    first, last = self._pairs[i % _POOL]
                    total += float(first.elapsed_time(last))
            except RuntimeError:  # not complete after all (another stream?): next time
                break
            self._push(total)
            read = end
        self._pair_read = read

    def _push(self, ms: float) -> None:
        self.ring[self._write % _RING] = ms
        self._write += 1

    def heartbeat_fields(self) -> JsonObject | None:
        if self._sections and self._cuda:
            self._read_cuda_pairs()
            method = "compute_section_cuda"
        elif self._sections:
            method = "compute_section_cpu"
        else:
            method = "step_cpu"
            if not self._warned_gpu_without_sections and self._n and cuda_in_use():
                self._warned_gpu_without_sections = True
                logger.warning(
                    "rankguard stragglers: this rank trains on a GPU but marks no "
                    "`with rg.compute():` section, so it is scored by the CPU time of "
                    "its training thread (kernel launches), not by the GPU's own time. "
                    "Wrap forward and backward in `with rg.compute():` to time them "
                    "with CUDA events."
                )
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
                "method": method,
            }
        }
