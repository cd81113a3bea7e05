"""Rank side: how long the rank's own work takes, not its waiting.

In a data-parallel job every rank's step time equals the slowest rank's: the gradient
all-reduce makes the fast ranks wait. So the probe times only what the rank itself
spends:

* CPU ranks: the CPU time of the training thread. A rank blocked in a collective, in a
  sleep or on a lock uses none, a rank computing uses it all, and oversubscribed cores
  do not inflate it. By default a step's CPU time is taken from one step end to the
  next; with ``with rg.compute():`` around the rank's own compute (forward and backward
  up to the first collective) only that is counted.
* GPU ranks (CUDA initialised when the first compute section opens): two timing CUDA
  events recorded on the current stream around each ``rg.compute()`` section. Recording
  is asynchronous (no device synchronisation); the heartbeat thread reads the elapsed
  device time once the end event's ``query()`` is true. Several sections in one step are
  summed. Without a marked section a GPU rank falls back to the CPU method, which there
  times kernel launches, not the device: the probe says so once, loudly.

Cost on the training thread. Reading a thread's CPU clock is a system call (never the
vDSO: about 0.9 us on a KVM guest), so:

* Step mode (no section marked): the training thread only counts its steps. Where Linux
  lets one thread read another's CPU clock (``time.pthread_getcpuclockid``), the thread
  that ends the first step is bound once, and the heartbeat thread reads its clock at
  each record: the sample is the CPU time between two reads over the steps that ended
  between them (the mean per step; no step ended: no sample). A step that straddles a
  read counts in the interval it ended in, so one sample is off by at most one step's
  CPU over the steps it covers, and consecutive samples add up exactly. Every step is
  covered: ``profiling_interval`` is moot. When the bound thread ends, the next step end
  binds the thread that calls it. Elsewhere (no ``pthread_getcpuclockid``) the training
  thread reads ``time.thread_time_ns`` every ``profiling_interval``-th step, as before.
* Section mode (``rg.compute()`` on CPU): the clock must be read at the section's edges,
  on the training thread. With a budget (``clock_budget_ns``, what a job's probe gets),
  the first section measures one read (a few reads, the fastest) and, where two reads
  per step cost more than the budget, only the sections of every k-th step are timed (k
  the smallest that keeps the two reads, amortised, under it; at least
  ``profiling_interval``), said in one INFO line with the figures.
* GPU sections: two ``Event.record`` calls on sampled steps.

The heartbeat thread publishes the median of the samples since its last record
(``straggler`` field; in step mode with remote reads, one sample per record).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, NamedTuple

from rankguard.rank.timeline import cuda_in_use
from rankguard.schema.jsontypes import JsonObject

__all__ = ["SECTION_CLOCK_BUDGET_NS", "ComputeProbe"]

logger = logging.getLogger(__name__)

_RING = 4096
# CUDA event pairs reused round-robin. The heartbeat thread reads a pair only while it is
# at most half a pool behind the training thread, so a pair is never re-recorded while
# it is being read.
_POOL = 1024
_READ_WINDOW = _POOL // 2
# What a job's probe may spend per step, amortised, on the thread CPU clock reads at the
# edges of `rg.compute()` sections (two per timed step): the rest of the probe's work per
# step is a few hundred ns of Python, the goal is under 1 us in all.
SECTION_CLOCK_BUDGET_NS = 300.0


class _Bound(NamedTuple):
    """The training thread whose CPU clock the heartbeat thread reads (step mode): its
    clock id, the thread, and its CPU time and the probe's step count when bound."""

    clock: int
    thread: threading.Thread
    cpu_ns: int
    steps: int


def clock_read_ns() -> float:
    """What one ``time.thread_time_ns()`` costs here (ns): the fastest of 3 rounds of 8
    reads, so that a preemption in one round does not count."""
    read = time.thread_time_ns
    best = math.inf
    for _ in range(3):
        t0 = perf_counter_ns()
        for _ in range(8):
            read()
        best = min(best, (perf_counter_ns() - t0) / 8)
    return best


def _timing_event() -> Any:
    import torch  # here, not at the top: `import rankguard` (light commands) stays torch-free

    return torch.cuda.Event(enable_timing=True)


class ComputeProbe:
    __slots__ = (
        "_bound",
        "_clock_budget_ns",
        "_clock_cost_ns",
        "_cuda",
        "_event_factory",
        "_every",
        "_inner",
        "_last_cpu",
        "_local",
        "_mark",
        "_n",
        "_pair_read",
        "_pair_step",
        "_pair_write",
        "_pairs",
        "_read",
        "_remote",
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
        clock_budget_ns: float | None = None,
        clock_cost_ns: float | None = None,
    ) -> None:
        """``cuda``: time sections with CUDA events (True), thread CPU time (False), or
        decide when the first section opens (None: CUDA when it is initialised).
        ``event_factory`` makes a timing event (default ``torch.cuda.Event``; tests use
        a fake). ``clock_budget_ns``: CPU sections' clock reads may cost this much per
        step, amortised (None: time every ``every``-th step's sections whatever it
        costs); ``clock_cost_ns``: one read's cost (None: measured at the first
        section)."""
        self._inner = step_end
        self._every = every
        self._n = 0
        self._clock_budget_ns = clock_budget_ns
        self._clock_cost_ns = clock_cost_ns
        # step mode: the heartbeat thread reads the bound thread's clock (_remote), or
        # the training thread reads its own (_local: no pthread_getcpuclockid)
        self._remote = False
        self._local = False
        self._bound: _Bound | None = None
        self._mark: tuple[_Bound, int, int] | None = None  # heartbeat thread's last read
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
        if self._remote:
            return  # step mode: the heartbeat thread reads this thread's CPU clock
        if self._sections:
            # CPU sections: the time is nonzero after a sampled step's section only (CUDA
            # sections leave it at 0: the heartbeat thread reads the event pairs)
            if self._section_cpu and n % self._every == 0:
                # one sampled step's compute section (see section_enter)
                self.ring[self._write % _RING] = self._section_cpu / 1e6
                self._write += 1
                self._section_cpu = 0
            return
        if not self._local and self._bind(n):
            return
        if n % self._every:
            return
        now = time.thread_time_ns()
        # the CPU time of the last `every` steps, published per step
        self.ring[self._write % _RING] = (now - self._last_cpu) / 1e6 / self._every
        self._last_cpu = now
        self._write += 1

    def _bind(self, n: int) -> bool:
        """Step mode's first step end (or the first after the bound thread ended): let
        the heartbeat thread read this thread's CPU clock from now on. False where it
        cannot (not Linux): this thread reads its own clock from now on."""
        get_clock_id = getattr(time, "pthread_getcpuclockid", None)
        if get_clock_id is not None:
            try:
                clock = get_clock_id(threading.get_ident())
                cpu = time.clock_gettime_ns(clock)
            except OSError:
                pass
            else:
                self._bound = _Bound(clock, threading.current_thread(), cpu, n)
                self._remote = True
                return True
        self._local = True
        return False

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

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
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
        self._remote = False  # from now on step_end collects the sections' time
        if self._cuda is None:
            self._cuda = cuda_in_use()
        if not self._cuda and self._clock_budget_ns is not None:
            self._fit_clock_budget(self._clock_budget_ns)

    def _fit_clock_budget(self, budget_ns: float) -> None:
        """Time the sections of every k-th step, k the smallest that keeps the two clock
        reads of a timed step under ``budget_ns`` per step (at least ``every``)."""
        cost = self._clock_cost_ns
        if cost is None:
            cost = self._clock_cost_ns = clock_read_ns()
        k = max(1, math.ceil(2 * cost / budget_ns))
        if k <= self._every:
            return
        logger.info(
            "rankguard stragglers: one read of the thread CPU clock costs %.0f ns here, so "
            "`rg.compute()` sections are timed on 1 step in %d (profiling_interval %d): "
            "%.0f ns of clock reads per step on average, budget %.0f ns",
            cost,
            k,
            self._every,
            2 * cost / k,
            budget_ns,
        )
        self._every = k

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

    def _read_bound_thread(self) -> tuple[float, int] | None:
        """Step mode: the bound thread's CPU time per step since the last read, and over
        how many steps (None: no step ended, or the thread is gone)."""
        bound = self._bound
        if bound is None:
            return None
        n = self._n
        try:
            cpu: int | None = time.clock_gettime_ns(bound.clock)
        except OSError:
            cpu = None
        if cpu is None or not bound.thread.is_alive():
            # The training thread ended (its thread id may even be reused): the next
            # step end binds the thread that calls it, from a fresh start.
            if self._bound is bound:
                self._bound = None
                self._remote = False
            return None
        mark = self._mark
        if mark is None or mark[0] is not bound:
            mark = (bound, bound.cpu_ns, bound.steps)
        _, last_cpu, last_n = mark
        if n <= last_n:
            self._mark = mark  # no step ended: the CPU belongs to the step in progress
            return None
        self._mark = (bound, cpu, n)
        if cpu <= last_cpu or self._bound is not bound:
            return None  # not the clock of the thread that made these steps
        return (cpu - last_cpu) / 1e6 / (n - last_n), n - last_n

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
            self._warn_gpu_without_sections()
            if self._bound is not None:  # the heartbeat thread reads the training thread's
                read = self._read_bound_thread()
                if read is None:
                    return None
                ms, steps = read
                return _fields(ms, steps, method)
        write = self._write
        start = max(self._read, write - _RING)
        if write <= start:
            return None
        samples = [self.ring[i % _RING] for i in range(start, write)]
        self._read = write
        return _fields(statistics.median(samples), len(samples), method)

    def _warn_gpu_without_sections(self) -> None:
        if not self._warned_gpu_without_sections and self._n and cuda_in_use():
            self._warned_gpu_without_sections = True
            logger.warning(
                "rankguard stragglers: this rank trains on a GPU but marks no "
                "`with rg.compute():` section, so it is scored by the CPU time of "
                "its training thread (kernel launches), not by the GPU's own time. "
                "Wrap forward and backward in `with rg.compute():` to time them "
                "with CUDA events."
            )


def _fields(ms: float, samples: int, method: str) -> JsonObject:
    """The ``straggler`` heartbeat field: ``samples`` steps' compute, ``ms`` per step."""
    return {"straggler": {"compute_ms": round(ms, 4), "samples": samples, "method": method}}
