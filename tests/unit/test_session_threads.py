"""Several sessions in one process, each on its own training thread (ranks as threads).

A session given its ``training_thread`` samples that thread's stack for its heartbeat's
``main_frame`` and phase, and counts only the optimizer steps taken on it; without one
it samples the main thread and counts every optimizer step (one session per process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.phases import PhaseWatcher, main_thread_frame, thread_frame
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.layout import heartbeat_file_name
from rankguard.session import Session
from tests.factories import rank_identity, read_records

pytestmark = pytest.mark.timeout(30)


def _session(tmp_path: Path, rank: int, thread: threading.Thread | None) -> Session:
    return Session(
        rank_identity(rank=rank, run_id="threads"),
        tmp_path,
        HeartbeatConfig(publish_interval_s=0.05),
        tracker=ProgressTracker(mode="cpu"),
        training_thread=thread,
    )


def _optimizer_steps(n: int) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()


def _in_thread(fn: Callable[[], Any]) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(20)
    assert not t.is_alive()
    if errors:
        raise errors[0]


def test_two_sessions_count_only_their_own_threads_optimizer_steps(tmp_path: Path) -> None:
    sessions: dict[int, Session] = {}
    ready = threading.Barrier(2, timeout=10)

    def rank(r: int, steps: int) -> None:
        session = sessions[r] = _session(tmp_path, r, threading.current_thread())
        session.install_optimizer_hook()
        ready.wait()  # both hooks are in before either rank steps
        _optimizer_steps(steps)
        ready.wait()

    threads = [threading.Thread(target=rank, args=(r, n)) for r, n in ((0, 3), (1, 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    try:
        assert [sessions[r].tracker.progress_seq for r in (0, 1)] == [3, 5]
    finally:
        for s in sessions.values():
            s.close()


def test_a_session_without_a_training_thread_counts_every_optimizer_step(
    tmp_path: Path,
) -> None:
    """One session per process, as before: a step on any thread is progress."""
    session = _session(tmp_path, 0, None)
    try:
        session.install_optimizer_hook()
        _in_thread(lambda: _optimizer_steps(2))
        assert session.tracker.progress_seq == 2
    finally:
        session.close()


def test_thread_frame_defaults_to_the_main_thread() -> None:
    seen: list[Any] = []
    _in_thread(lambda: seen.append((thread_frame(), main_thread_frame())))
    frame, main = seen[0]
    assert frame is not None and main is not None
    assert frame.f_code is main.f_code  # this test function's frame, as the main thread's


def _wait_for(path: Path, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists():
            for rec in read_records(path):
                if pred(rec):
                    return rec
        time.sleep(0.02)
    raise AssertionError(f"no such record in {path}")


def test_the_heartbeat_samples_the_training_threads_stack(tmp_path: Path) -> None:
    """``main_frame`` and the recognised phase come from the rank's thread, not from the
    process's main thread (here the test, waiting in ``_wait_for``)."""
    release = threading.Event()
    holder: list[Session] = []

    def evaluate() -> None:  # a recognised evaluation on the rank's own stack
        deadline = time.monotonic() + 10
        while not release.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)  # C code: this function is the innermost Python frame

    def rank() -> None:
        session = _session(tmp_path, 0, threading.current_thread())
        holder.append(session)
        session.step_end()  # in train: the phase is read from the stack
        evaluate()

    t = threading.Thread(target=rank)
    t.start()
    try:
        path = tmp_path / heartbeat_file_name(0, os.getpid())
        rec = _wait_for(path, lambda r: r.get("phase") == "eval")
        assert rec["main_frame"].endswith("in evaluate"), rec["main_frame"]
    finally:
        release.set()
        t.join(10)
        for s in holder:
            s.close()


def test_a_phase_watcher_samples_its_training_thread() -> None:
    tracker = ProgressTracker(mode="cpu")
    tracker.step_end()
    started, release = threading.Event(), threading.Event()

    def validate() -> None:
        started.set()
        release.wait(10)

    t = threading.Thread(target=validate)
    t.start()
    try:
        assert started.wait(10)
        assert PhaseWatcher(tracker, training_thread=t).observe()[0] == "eval"
        assert PhaseWatcher(tracker).observe()[0] == "train"  # the main thread: the test
    finally:
        release.set()
        t.join(10)
