"""The probe's thread CPU clock reads: in step mode the heartbeat thread reads the training
thread's clock (``pthread_getcpuclockid``) and the training thread only counts steps; in
section mode the clock reads are thinned to a budget. Fake per-thread clocks where
exact figures matter, one real read of a busy thread from another thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import types
from collections import Counter

import pytest

import rankguard.straggler.probe as probe_mod
from rankguard.straggler.probe import ComputeProbe


class FakeClocks:
    """Stands in for ``time`` inside the probe: one CPU clock per thread (by ident), read
    by the thread itself (``thread_time_ns``) or by any thread through its clock id."""

    def __init__(self) -> None:
        self.ns: Counter[int] = Counter()  # thread ident -> CPU ns
        self.reads: Counter[tuple[str, int]] = Counter()  # (call, calling thread) -> n
        self.gone: set[int] = set()  # threads that ended: their clock reads fail
        self._ids: dict[int, int] = {}  # clock id -> thread ident

    def spend(self, ms: float, ident: int | None = None) -> None:
        self.ns[threading.get_ident() if ident is None else ident] += int(ms * 1e6)

    def reads_by(self, ident: int) -> int:
        return sum(n for (_, who), n in self.reads.items() if who == ident)

    def pthread_getcpuclockid(self, ident: int) -> int:
        clock = 1000 + len(self._ids)
        self._ids[clock] = ident
        return clock

    def clock_gettime_ns(self, clock: int) -> int:
        self.reads["clock_gettime_ns", threading.get_ident()] += 1
        ident = self._ids[clock]
        if ident in self.gone:
            raise OSError(22, "Invalid argument")
        return self.ns[ident]

    def thread_time_ns(self) -> int:
        self.reads["thread_time_ns", threading.get_ident()] += 1
        return self.ns[threading.get_ident()]


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> FakeClocks:
    fake = FakeClocks()
    monkeypatch.setattr(
        probe_mod,
        "time",
        types.SimpleNamespace(
            thread_time_ns=fake.thread_time_ns,
            clock_gettime_ns=fake.clock_gettime_ns,
            pthread_getcpuclockid=fake.pthread_getcpuclockid,
        ),
    )
    return fake


def _straggler(probe: ComputeProbe) -> dict[str, object] | None:
    fields = probe.heartbeat_fields()
    return None if fields is None else fields["straggler"]  # type: ignore[return-value]


# ---- step mode: the heartbeat thread reads the clock ------------------------------------


def test_step_mode_training_thread_reads_the_clock_once_then_only_counts(
    clocks: FakeClocks,
) -> None:
    probe = ComputeProbe(lambda i: None)
    me = threading.get_ident()
    clocks.reads.clear()
    clocks.spend(500.0)  # start-up before the first step end: not a step's compute
    probe.step_end()  # binds this thread: one read, the baseline
    assert clocks.reads_by(me) == 1
    for ms in (10.0, 30.0, 20.0):
        clocks.spend(ms)
        probe.step_end()
    assert clocks.reads_by(me) == 1  # the steps read no clock
    assert _straggler(probe) == {"compute_ms": 20.0, "samples": 3, "method": "step_cpu"}


def test_step_mode_no_step_ended_is_no_sample_and_the_cpu_goes_to_the_next(
    clocks: FakeClocks,
) -> None:
    probe = ComputeProbe(lambda i: None)
    probe.step_end()
    assert _straggler(probe) is None  # bound, no step since: nothing (not a zero)
    clocks.spend(8.0)
    probe.step_end()
    clocks.spend(6.0)  # a long step straddles two reads
    assert _straggler(probe) == {"compute_ms": 14.0, "samples": 1, "method": "step_cpu"}
    clocks.spend(6.0)
    assert _straggler(probe) is None  # still in that step
    clocks.spend(2.0)
    probe.step_end()
    clocks.spend(4.0)
    probe.step_end()
    # 8 + 4 ms since the last read, over the 2 steps that ended: the sums add up
    assert _straggler(probe) == {"compute_ms": 6.0, "samples": 2, "method": "step_cpu"}


def test_step_mode_profiling_interval_is_moot(clocks: FakeClocks) -> None:
    probe = ComputeProbe(lambda i: None, every=4)
    probe.step_end()
    for _ in range(6):
        clocks.spend(3.0)
        probe.step_end()
    assert _straggler(probe) == {"compute_ms": 3.0, "samples": 6, "method": "step_cpu"}


def test_step_mode_training_thread_ends_the_next_step_end_binds_its_caller(
    clocks: FakeClocks,
) -> None:
    probe = ComputeProbe(lambda i: None)
    first: list[int] = []

    def train() -> None:
        first.append(threading.get_ident())
        probe.step_end()
        clocks.spend(5.0)
        probe.step_end()

    t = threading.Thread(target=train)
    t.start()
    t.join()
    assert _straggler(probe) is None  # the bound thread is gone: no sample from it
    clocks.gone.add(first[0])
    clocks.spend(100.0)  # this thread's CPU before it steps: not counted
    probe.step_end()  # binds this thread
    clocks.spend(7.0)
    probe.step_end()
    clocks.spend(9.0)
    probe.step_end()
    assert _straggler(probe) == {"compute_ms": 8.0, "samples": 2, "method": "step_cpu"}


def test_step_mode_clock_read_failing_is_no_sample_then_a_rebind(clocks: FakeClocks) -> None:
    probe = ComputeProbe(lambda i: None)
    probe.step_end()
    clocks.spend(5.0)
    probe.step_end()
    clocks.gone.add(threading.get_ident())  # e.g. the thread id no longer readable
    assert _straggler(probe) is None
    clocks.gone.clear()
    clocks.spend(50.0)
    probe.step_end()  # binds afresh: the baseline, no sample yet
    assert _straggler(probe) is None
    clocks.spend(2.0)
    probe.step_end()
    assert _straggler(probe) == {"compute_ms": 2.0, "samples": 1, "method": "step_cpu"}


def _spin_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_real_clock_of_a_busy_thread_read_from_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training thread spins 10 ms of CPU and sleeps 20 ms per step; this thread,
    spinning too, reads its CPU clock: 10 ms per step, with no clock read per step."""
    own_reads: Counter[int] = Counter()

    def thread_time_ns() -> int:
        own_reads[threading.get_ident()] += 1
        return time.thread_time_ns()

    monkeypatch.setattr(
        probe_mod,
        "time",
        types.SimpleNamespace(
            thread_time_ns=thread_time_ns,
            clock_gettime_ns=time.clock_gettime_ns,
            pthread_getcpuclockid=time.pthread_getcpuclockid,
        ),
    )
    probe = ComputeProbe(lambda i: None)
    bound, go, done, leave = (threading.Event() for _ in range(4))

    def train() -> None:
        probe.step_end()
        bound.set()
        go.wait(5.0)
        for _ in range(3):
            _spin_cpu(0.01)
            time.sleep(0.02)  # a rank waiting uses no CPU
            probe.step_end()
        done.set()
        leave.wait(5.0)  # alive while it is read (an ended thread gives no sample)

    t = threading.Thread(target=train)
    t.start()
    try:
        assert bound.wait(5.0)
        assert probe.heartbeat_fields() is None  # no step since the binding one
        go.set()
        _spin_cpu(0.05)  # this thread's CPU is not the training thread's
        assert done.wait(10.0)
        fields = _straggler(probe)
    finally:
        go.set()
        leave.set()
        t.join(10.0)
    assert fields is not None
    assert fields["samples"] == 3 and fields["method"] == "step_cpu"
    assert 9.0 <= fields["compute_ms"] < 25.0, fields  # type: ignore[operator]
    assert own_reads[t.ident or 0] == 0  # the training thread read no clock of its own


# ---- section mode: the clock reads within a budget ---------------------------------------


def _sectioned_steps(probe: ComputeProbe, clocks: FakeClocks, steps: int, ms: float) -> None:
    for _ in range(steps):
        clocks.spend(50.0)  # outside the section
        with probe:
            clocks.spend(ms)
        probe.step_end()


def test_sections_every_kth_step_timed_when_the_clock_is_dear(
    clocks: FakeClocks, caplog: pytest.LogCaptureFixture
) -> None:
    probe = ComputeProbe(lambda i: None, cuda=False, clock_budget_ns=300.0, clock_cost_ns=910.0)
    clocks.reads.clear()
    with caplog.at_level(logging.INFO, logger=probe_mod.__name__):
        _sectioned_steps(probe, clocks, 21, 4.0)
    k = math.ceil(2 * 910.0 / 300.0)  # 7: 260 ns per step on average
    assert clocks.reads["thread_time_ns", threading.get_ident()] == 2 * (21 // k)
    assert _straggler(probe) == {
        "compute_ms": 4.0,
        "samples": 21 // k,
        "method": "compute_section_cpu",
    }
    lines = [r.getMessage() for r in caplog.records if "thread CPU clock" in r.getMessage()]
    assert len(lines) == 1
    assert "910 ns" in lines[0] and "1 step in 7" in lines[0] and "260 ns" in lines[0]


def test_sections_every_step_timed_when_the_clock_is_cheap(
    clocks: FakeClocks, caplog: pytest.LogCaptureFixture
) -> None:
    probe = ComputeProbe(lambda i: None, cuda=False, clock_budget_ns=300.0, clock_cost_ns=120.0)
    with caplog.at_level(logging.INFO, logger=probe_mod.__name__):
        _sectioned_steps(probe, clocks, 5, 4.0)
    assert _straggler(probe) == {"compute_ms": 4.0, "samples": 5, "method": "compute_section_cpu"}
    assert not [r for r in caplog.records if "thread CPU clock" in r.getMessage()]


def test_sections_profiling_interval_above_the_budget_interval_stays(clocks: FakeClocks) -> None:
    probe = ComputeProbe(
        lambda i: None, every=10, cuda=False, clock_budget_ns=300.0, clock_cost_ns=910.0
    )
    _sectioned_steps(probe, clocks, 20, 4.0)
    fields = _straggler(probe)
    assert fields is not None and fields["samples"] == 2


def test_sections_measure_the_clock_at_the_first_section() -> None:
    probe = ComputeProbe(lambda i: None, cuda=False, clock_budget_ns=1e12)
    assert probe._clock_cost_ns is None
    with probe:
        pass
    cost = probe._clock_cost_ns
    assert cost is not None and 0 < cost < 1e7  # a real read: ns to us, not seconds
