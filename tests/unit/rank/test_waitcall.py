"""The native call a thread's innermost Python frame is in, by its bytecode: a pipeline
stage waiting on a gloo request's ``Work.wait`` (no flight-recorder entry, no Python
frame of its own) reads ``wait``."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rankguard.rank.identity import RankIdentity
from rankguard.rank.publisher import HeartbeatPublisher
from rankguard.rank.timeline import ProgressTracker
from rankguard.rank.waitcall import WAIT_CALL, native_call
from tests.factories import rank_identity, read_records

pytestmark = pytest.mark.timeout(60)


def _call_in(target: Callable[[], object], release: Callable[[], None]) -> str | None:
    """``native_call`` of a thread blocked in ``target``, then released."""
    t = threading.Thread(target=target, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        got = None
        while time.monotonic() < deadline:
            time.sleep(0.05)
            got = native_call(sys._current_frames().get(t.ident or -1))
            if got is not None:
                break
        return got
    finally:
        release()
        t.join(10)


def _pair() -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Two gloo ranks of one process (a hash store)."""
    store = dist.HashStore()
    made: dict[int, dist.ProcessGroup] = {}

    def make(rank: int) -> None:
        made[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=20))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return made[0], made[1]


def test_a_thread_waiting_on_a_gloo_receive_request_is_in_wait() -> None:
    pg0, pg1 = _pair()
    buf = torch.zeros(4)

    def recv() -> None:
        for w in [pg0.recv([buf], 1, 0)]:
            w.wait()

    got = _call_in(recv, lambda: pg1.send([torch.ones(4)], 0, 0).wait())
    assert got == WAIT_CALL
    assert buf.tolist() == [1.0] * 4


def test_sleep_and_pythons_own_waits_are_not_wait() -> None:
    stop = threading.Event()
    assert _call_in(lambda: time.sleep(0.5), lambda: None) == "sleep"
    # threading.Event.wait is Python: the innermost frame is in threading.py, at a lock
    assert _call_in(stop.wait, stop.set) == "acquire"


def test_a_call_whose_arguments_are_expressions_is_not_read() -> None:
    def f() -> None:
        time.sleep(min(0.5, 1.0))

    assert _call_in(f, lambda: None) is None
    assert native_call(None) is None


def test_the_heartbeat_carries_the_training_threads_native_call(tmp_path: Path) -> None:
    pg0, pg1 = _pair()
    buf = torch.zeros(4)

    def recv() -> None:
        pg0.recv([buf], 1, 0).wait()

    t = threading.Thread(target=recv, daemon=True)
    t.start()
    ident: RankIdentity = rank_identity(run_id="run-wait", rank=0, world_size=2)
    pub = HeartbeatPublisher(ident, tmp_path, ProgressTracker(mode="cpu"), 0.05, training_thread=t)
    pub.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(r.get("main_call") == WAIT_CALL for r in read_records(pub.path)):
                break
            time.sleep(0.05)
    finally:
        pub.close()
        pg1.send([torch.ones(4)], 0, 0).wait()
        t.join(10)
    assert any(r.get("main_call") == WAIT_CALL for r in read_records(pub.path))
