"""Simulated faults: deterministic choice, only on the target rank, and real effects on a
child process (stalled main thread, SIGKILL, SIGSTOP)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.simulate import STALL_SIGNAL, FaultSimulator
from tests.factories import proc_state as _state

CONCRETE = {"rank_hung", "rank_killed", "rank_stalled"}

# A rank: the simulator armed at start-up (rank 0 of 1, base delay 0.1 s), the main
# thread printing a counter, a second thread printing "alive".
CHILD = """\
import sys, threading, time
from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.simulate import FaultSimulator

cfg = FaultToleranceConfig(
    simulate_fault=True,
    simulated_fault_type=sys.argv[1],
    simulated_fault_rank=0,
    simulated_fault_base_delay=0.1,
)
FaultSimulator(cfg, rank=0, world_size=1, run_id="sim").start()

def alive():
    while True:
        # One write per line, so the two threads' lines never interleave.
        sys.stdout.write("alive\\n")
        sys.stdout.flush()
        time.sleep(0.02)

threading.Thread(target=alive, daemon=True).start()
i = 0
while True:
    sys.stdout.write(f"main {i}\\n")
    sys.stdout.flush()
    i += 1
    time.sleep(0.02)
"""


def _cfg(**kw: Any) -> FaultToleranceConfig:
    return FaultToleranceConfig(simulate_fault=True, **kw)


@pytest.fixture
def start_child() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []

    def start(fault: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-c", CHILD, fault], stdout=subprocess.PIPE, text=True
        )
        children.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


# ---- choice --------------------------------------------------------------------------


def test_random_choice_is_deterministic_per_run_id() -> None:
    cfg = _cfg(simulated_fault_type="random")
    choices = set()
    for i in range(40):
        a = FaultSimulator(cfg, rank=0, world_size=8, run_id=f"run-{i}")
        b = FaultSimulator(cfg, rank=5, world_size=8, run_id=f"run-{i}")
        # Every rank computes the same fault, target and delay from the run id.
        assert (a.fault, a.target, a.delay_s) == (b.fault, b.target, b.delay_s)
        assert a.fault in CONCRETE
        assert 0 <= a.target < 8
        choices.add((a.fault, a.target))
    assert {fault for fault, _ in choices} == CONCRETE
    assert len({target for _, target in choices}) > 1


def test_explicit_rank_and_type_are_honoured() -> None:
    for fault in sorted(CONCRETE):
        cfg = _cfg(simulated_fault_type=fault, simulated_fault_rank=3)
        for run_id in ("a", "b", "c"):
            sim = FaultSimulator(cfg, rank=0, world_size=8, run_id=run_id)
            assert sim.fault == fault
            assert sim.target == 3


def test_armed_only_on_the_target_rank() -> None:
    cfg = _cfg(simulated_fault_type="rank_killed", simulated_fault_rank=2)
    armed = [FaultSimulator(cfg, rank=r, world_size=4, run_id="x").armed for r in range(4)]
    assert armed == [False, False, True, False]
    # Random target: exactly one rank of the world is armed.
    cfg = _cfg(simulated_fault_type="random")
    for run_id in ("p", "q", "r", "s"):
        armed = [FaultSimulator(cfg, rank=r, world_size=6, run_id=run_id).armed for r in range(6)]
        assert armed.count(True) == 1


def test_delay_between_base_and_twice_base() -> None:
    cfg = _cfg(simulated_fault_base_delay=10.0)
    delays = [FaultSimulator(cfg, rank=0, world_size=2, run_id=f"d{i}").delay_s for i in range(50)]
    assert all(10.0 <= d < 20.0 for d in delays)
    assert max(delays) - min(delays) > 1.0  # spread over the range, not a constant
    zero = FaultSimulator(_cfg(simulated_fault_base_delay=0.0), rank=0, world_size=1, run_id="z")
    assert zero.delay_s == 0.0


def test_start_on_a_non_target_rank_starts_nothing() -> None:
    cfg = _cfg(simulated_fault_type="rank_stalled", simulated_fault_rank=1)
    sim = FaultSimulator(cfg, rank=0, world_size=2, run_id="n")
    before = signal.getsignal(STALL_SIGNAL)
    sim.start()
    assert sim._thread is None
    assert signal.getsignal(STALL_SIGNAL) == before  # no stall handler installed


# ---- real effects --------------------------------------------------------------------


def test_rank_stalled_stops_the_main_thread_only(
    start_child: Callable[[str], subprocess.Popen[str]],
) -> None:
    proc = start_child("rank_stalled")
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 15.0
    fault_at: int | None = None
    after_deadline = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if fault_at is None and "simulating fault rank_stalled on rank 0" in line:
            fault_at = len(lines)
            after_deadline = time.monotonic() + 0.6
        if after_deadline is not None and time.monotonic() > after_deadline:
            break
    assert fault_at is not None, lines[-5:]
    before, after = lines[: fault_at - 1], lines[fault_at:]
    assert sum(line.startswith("main") for line in before) >= 1
    mains = [i for i, line in enumerate(after) if line.startswith("main")]
    assert len(mains) <= 2  # at most a print racing the signal
    # The main thread's counter has stopped; the other thread keeps printing.
    assert sum(line == "alive" for line in after[(mains[-1] + 1 if mains else 0) :]) >= 5
    assert proc.poll() is None  # stalled, not dead


def test_rank_killed_child_exits_with_sigkill(
    start_child: Callable[[str], subprocess.Popen[str]],
) -> None:
    proc = start_child("rank_killed")
    assert proc.wait(timeout=15) == -signal.SIGKILL
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert "main 0" in out
    assert "simulating fault rank_killed on rank 0" in out


def test_rank_hung_child_is_stopped(start_child: Callable[[str], subprocess.Popen[str]]) -> None:
    proc = start_child("rank_hung")
    deadline = time.monotonic() + 15.0
    state = _state(proc.pid)
    while state not in "Tt" and time.monotonic() < deadline:
        time.sleep(0.02)
        state = _state(proc.pid)
    assert state in "Tt"
    assert proc.poll() is None
    proc.kill()  # a stopped process still dies of SIGKILL
    assert proc.wait(timeout=5) == -signal.SIGKILL
