"""Reaching the training thread: interrupting it, seeing it stuck, aborting NCCL (fake)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.inprocess.interrupt import Interrupter, Liveness, RestartInterrupt
from rankguard.inprocess.wrapper import abort_communicators


def _fire_later(interrupter: Interrupter, delay: float) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), interrupter.fire("peer")))
    t.start()
    return t


def test_signal_interrupts_a_blocking_sleep_on_the_main_thread() -> None:
    assert threading.current_thread() is threading.main_thread()
    it = Interrupter()
    it.install()
    try:
        it.armed = True
        t0 = time.monotonic()
        firing = _fire_later(it, 0.2)
        with pytest.raises(RestartInterrupt, match="peer"):
            time.sleep(30)
        assert time.monotonic() - t0 < 5
        assert not it.armed  # one delivery, one raise
        firing.join()
        it.fire("again")  # disarmed: nothing is raised
        time.sleep(0.1)
    finally:
        it.uninstall()


def test_an_unarmed_interrupter_raises_nothing() -> None:
    it = Interrupter()
    it.install()
    try:
        firing = _fire_later(it, 0.05)
        time.sleep(0.3)
        firing.join()
        assert it.deliveries == 0
    finally:
        it.uninstall()


def test_another_thread_gets_an_async_exception() -> None:
    seen: list[str] = []

    def body() -> None:
        it = Interrupter()
        it.armed = True
        holder.append(it)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # Python code: the async exception lands
                time.sleep(0.01)
        except RestartInterrupt:
            seen.append("interrupted")

    holder: list[Interrupter] = []
    t = threading.Thread(target=body)
    t.start()
    while not holder:
        time.sleep(0.01)
    holder[0].fire("peer")
    t.join(timeout=10)
    assert seen == ["interrupted"]


def test_liveness_stops_while_the_main_thread_is_blocked() -> None:
    live = Liveness()
    stop = threading.Event()
    idle: list[float] = []

    def ask() -> None:
        while not stop.is_set():
            live.ask()
            idle.append(live.idle_s())
            time.sleep(0.02)

    t = threading.Thread(target=ask)
    t.start()
    try:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            pass  # running Python: the callbacks run
        assert max(idle) < 0.2
        time.sleep(0.6)  # blocked in C: no callback runs until it returns
        assert max(idle) >= 0.5
    finally:
        stop.set()
        t.join()


class _FakeGroup:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def _fake_dist(group: Any, initialized: bool = True) -> Any:
    return SimpleNamespace(is_initialized=lambda: initialized, group=SimpleNamespace(WORLD=group))


def test_nccl_communicator_is_aborted_gloo_is_left_to_its_timeout() -> None:
    group = _FakeGroup()
    abort_communicators(_fake_dist(group), "nccl")
    assert group.aborted == 1
    abort_communicators(_fake_dist(group), "gloo")
    abort_communicators(_fake_dist(group, initialized=False), "nccl")
    assert group.aborted == 1


def test_session_carries_added_heartbeat_blocks(tmp_path: Any) -> None:
    from rankguard.schema.blocks import InProcessBlock
    from rankguard.session import Session
    from tests.factories import heartbeat_config, rank_identity

    session = Session(rank_identity(), tmp_path, heartbeat_config(), publish=True)
    try:
        session.add_heartbeat_block(lambda: InProcessBlock(restarts=2))
        assert session.publisher is not None
        session.publisher.wake()
        deadline = time.monotonic() + 5
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not seen:
            lines = session.publisher.path.read_text().splitlines()
            seen = [r for r in map(json.loads, lines) if "inprocess" in r]
            time.sleep(0.01)
    finally:
        session.close()
    assert seen and seen[0]["inprocess"] == {"restarts": 2, "recovering": False}
