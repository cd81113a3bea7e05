"""Wakeup: what a signal handler may call (no lock), and what the relay and the
preemption coordinator wait on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from rankguard.relay.relay import StoreRelay
from rankguard.util.wakeup import Wakeup
from tests.factories import DictStore


def test_a_signal_handler_wakes_a_waiting_thread() -> None:
    wake = Wakeup()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(wake.wait(10.0)))
    waiter.start()

    def handler(signum: int, frame: FrameType | None) -> None:
        wake.set()
        wake.set()  # a second wake-up from inside the first one's handler: no lock

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        waiter.join(5.0)
        assert woke == [True] and time.monotonic() - t0 < 5.0
    finally:
        signal.signal(signal.SIGUSR1, previous)
    # The waiter may wake between the handler's two set() calls and clear the first; the
    # second then stays pending (one wake-up, never more), and one wait clears it.
    wake.wait(0.0)
    assert wake.wait(0.0) is False


def test_set_never_blocks_even_when_nobody_waits() -> None:
    wake = Wakeup()
    t0 = time.monotonic()
    for _ in range(200_000):  # far more than a pipe holds
        wake.set()
    assert time.monotonic() - t0 < 10.0
    assert wake.wait(0.0) is True and wake.wait(0.0) is False
    wake.close()


def test_the_relay_is_woken_without_a_lock(tmp_path: Path) -> None:
    relay = StoreRelay(DictStore(), tmp_path, "r", node_rank=1, interval_s=30.0)
    relay.start()
    try:
        time.sleep(0.1)
        pushes = relay.pushes
        relay.note_shutdown("SIGTERM")  # what the agent's signal handler calls
        deadline = time.monotonic() + 5.0
        while relay.pushes == pushes and time.monotonic() < deadline:
            time.sleep(0.02)
        assert relay.pushes > pushes
        assert isinstance(relay._wake, Wakeup)
    finally:
        t0 = time.monotonic()
        relay.stop()
    assert time.monotonic() - t0 < 5.0  # stop wakes the thread: no 30 s interval waited
