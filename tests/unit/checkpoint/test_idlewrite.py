"""An async save's thread writer in ``SCHED_IDLE`` (``async_write_priority: idle``): the
write runs in the idle class for at most ``async_idle_max_s``, then at the training's
priority, so a training that leaves no core idle cannot starve it; where the process
may not raise a thread back, the write keeps the training's priority and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.checkpoint import CheckpointConfig, CheckpointManager, idlewrite
from rankguard.checkpoint.idlewrite import IdleOutcome, IdleWindow, restore_permitted

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes"),
]

needs_restore = pytest.mark.skipif(
    not restore_permitted(), reason="raising a thread back from SCHED_IDLE not permitted"
)


def _policy(tid: int | None = None) -> int:
    return os.sched_getscheduler(threading.get_native_id() if tid is None else tid)


def _in_thread(fn: Any) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    assert not t.is_alive()
    return out[0]


@needs_restore
def test_the_window_lowers_the_calling_thread_and_gives_its_policy_back() -> None:
    def run() -> tuple[int, int, int, IdleOutcome]:
        with IdleWindow(30.0) as window:
            inside = _policy()
            timers = [t for t in threading.enumerate() if t.name == "rankguard-idle-bound"]
            assert len(timers) == 1 and timers[0].native_id is not None
            timer = _policy(timers[0].native_id)  # started before the lowering
        return inside, timer, _policy(), window.outcome

    assert _in_thread(run) == (os.SCHED_IDLE, os.SCHED_OTHER, os.SCHED_OTHER, IdleOutcome.IDLE)
    assert _policy() == os.SCHED_OTHER  # the caller of the test: untouched


@needs_restore
def test_the_bound_gives_the_policy_back_while_the_write_goes_on() -> None:
    def run() -> tuple[int, int, IdleOutcome, float]:
        with IdleWindow(0.2) as window:
            first = _policy()
            deadline = time.monotonic() + 30
            while _policy() == os.SCHED_IDLE and time.monotonic() < deadline:
                time.sleep(0.01)
            later = _policy()
        return first, later, window.outcome, window.idle_s

    first, later, outcome, idle_s = _in_thread(run)
    assert (first, later, outcome) == (os.SCHED_IDLE, os.SCHED_OTHER, IdleOutcome.BOUNDED)
    assert 0.2 <= idle_s < 30


def test_a_window_that_may_not_raise_the_thread_back_never_lowers_it() -> None:
    def run() -> tuple[int, IdleOutcome]:
        with IdleWindow(30.0, permitted=False) as window:
            return _policy(), window.outcome

    assert _in_thread(run) == (os.SCHED_OTHER, IdleOutcome.NOT_PERMITTED)


def _starved(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose cores the training keeps busy, at its worst: a thread that lowers
    itself to SCHED_IDLE gets no core until another thread raises it back."""
    real = os.sched_setscheduler
    raised: dict[int, threading.Event] = {}

    def starved(tid: int, policy: int, param: os.sched_param) -> None:
        me = threading.get_native_id()
        real(tid, policy, param)
        if policy == os.SCHED_IDLE and tid == me:
            raised.setdefault(tid, threading.Event()).wait(10)
        elif policy != os.SCHED_IDLE:
            raised.setdefault(tid, threading.Event()).set()

    monkeypatch.setattr(os, "sched_setscheduler", starved)


@needs_restore
def test_the_permission_is_known_without_a_core_for_a_thread_in_sched_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked in DCP's checkpoint process while the training keeps every core busy: a
    probe that waited for a thread in SCHED_IDLE to run again answered False after its
    5 s wait (it took 2-3 s at 6 CPU-bound processes on 2 cores), and the write then
    stayed in SCHED_IDLE for good."""
    _starved(monkeypatch)
    t0 = time.monotonic()
    assert idlewrite._probe() is True
    assert time.monotonic() - t0 < 4


def _late_lowering(monkeypatch: pytest.MonkeyPatch, late_s: float) -> None:
    """A lowering to SCHED_IDLE that takes effect ``late_s`` late (the thread making it
    preempted just before, as on a loaded node)."""
    real = os.sched_setscheduler

    def late(tid: int, policy: int, param: os.sched_param) -> None:
        if policy == os.SCHED_IDLE:
            time.sleep(late_s)
        real(tid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", late)


@needs_restore
def test_a_late_lowering_is_still_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound that ran out before the lowering took effect left the thread in
    SCHED_IDLE for the rest of the write: the bound counts from the lowering. (Whether
    the thread ran again in SCHED_IDLE before the bound is not asked: on a loaded node
    it may not; ``BOUNDED`` says it was lowered, then raised back by the bound.)"""
    _late_lowering(monkeypatch, 0.6)

    def run() -> tuple[int, IdleOutcome, float]:
        with IdleWindow(0.2) as window:
            deadline = time.monotonic() + 5
            while _policy() == os.SCHED_IDLE and time.monotonic() < deadline:
                time.sleep(0.01)
            later = _policy()
        return later, window.outcome, window.idle_s

    later, outcome, idle_s = _in_thread(run)
    assert (later, outcome) == (os.SCHED_OTHER, IdleOutcome.BOUNDED)
    assert 0.2 <= idle_s < 5


def _spinner(cpu: int) -> subprocess.Popen[bytes]:
    """A process at the normal priority keeping ``cpu`` busy."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(proc.pid, {cpu})
    return proc


@needs_restore
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_a_write_on_a_core_kept_busy_still_ends_soon_after_the_bound() -> None:
    """The training (here a process spinning on the writer's only core) leaves no gap:
    in SCHED_IDLE the write would get a sliver of the core (about 1/300th); after the
    bound it gets its share and ends."""
    cpu = min(os.sched_getaffinity(0))
    work = os.urandom(8 << 20)
    crcs = 40  # about 0.3 s of one core on the benchmarks' VM (zlib, 0.9 GB/s)

    def run() -> tuple[IdleOutcome, float, float]:
        os.sched_setaffinity(0, {cpu})  # this thread only
        t0 = time.monotonic()
        with IdleWindow(0.5) as window:
            for _ in range(crcs):
                zlib.crc32(work)
        return window.outcome, window.idle_s, time.monotonic() - t0

    spinner = _spinner(cpu)
    try:
        time.sleep(0.2)
        outcome, idle_s, took = _in_thread(run)
    finally:
        spinner.kill()
        spinner.wait()
    assert outcome is IdleOutcome.BOUNDED
    assert 0.5 <= idle_s < 5
    assert took < 45  # unbounded: a sliver of the core for the whole write


def _save_and_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_s: float = 0.0, **kw: Any
) -> list[int]:
    """An async save through the manager (checked to load back); the writing thread's
    policy as it starts writing and after ``slow_s`` seconds."""
    from rankguard.checkpoint.background import BackgroundWriter

    seen: list[int] = []
    write = BackgroundWriter._write_data

    def spy(self: BackgroundWriter, planner: Any, file_queue: Any) -> Any:
        seen.append(_policy())
        time.sleep(slow_s)
        seen.append(_policy())
        return write(self, planner, file_queue)

    monkeypatch.setattr(BackgroundWriter, "_write_data", spy)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optim": opt}
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=True, **kw)
    with CheckpointManager(config, state, session=False) as m:
        m.save(1)
        deadline = time.monotonic() + 60
        while m.in_flight and time.monotonic() < deadline:  # not wait(): it ends the window
            time.sleep(0.01)
        m.wait()
        assert _policy() == os.SCHED_OTHER  # the training thread keeps its priority
        assert m.last_committed["persistent"] == 1
        before = model.weight.detach().clone()
        with torch.no_grad():
            model.weight.add_(1.0)
        assert m.load_latest() == 1
        assert torch.equal(model.weight, before)
    return seen


@needs_restore
def test_an_idle_async_save_writes_in_sched_idle_and_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _save_and_watch(tmp_path, monkeypatch, async_write_priority="idle", async_idle_max_s=1.0)
    assert seen == [os.SCHED_IDLE, os.SCHED_IDLE]


@needs_restore
def test_an_idle_write_past_its_bound_goes_on_at_the_trainings_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _save_and_watch(
        tmp_path, monkeypatch, async_write_priority="idle", async_idle_max_s=0.05, slow_s=0.5
    )
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER]
    err = capsys.readouterr().err
    assert "SCHED_IDLE (the training left too few idle cores)" in err, err


def test_the_default_write_keeps_the_trainings_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _save_and_watch(tmp_path, monkeypatch) == [os.SCHED_OTHER, os.SCHED_OTHER]


def test_idle_where_it_cannot_be_undone_warns_once_and_writes_normally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(idlewrite, "restore_permitted", lambda: False)
    from rankguard.checkpoint.background import BackgroundWriter

    seen: list[int] = []
    write = BackgroundWriter._write_data

    def spy(self: BackgroundWriter, planner: Any, file_queue: Any) -> Any:
        seen.append(_policy())
        return write(self, planner, file_queue)

    monkeypatch.setattr(BackgroundWriter, "_write_data", spy)
    model = torch.nn.Linear(16, 16)
    config = CheckpointConfig(
        save=str(tmp_path / "ckpt"), async_save=True, async_write_priority="idle"
    )
    with CheckpointManager(config, {"model": model}, session=False) as m:
        for step in (1, 2):
            m.save(step)
            # the write runs before anything waits for it: a write waited for before it
            # starts runs at the training's priority anyway, and says nothing
            deadline = time.monotonic() + 60
            while m.last_committed.get("persistent") != step:
                assert time.monotonic() < deadline, m.last_committed
                time.sleep(0.01)
            m.wait()
        assert m.last_committed["persistent"] == 2
    assert seen == [os.SCHED_OTHER, os.SCHED_OTHER]
    err = capsys.readouterr().err
    assert err.count("async_write_priority=idle has NO effect") == 1, err


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"async_write_priority": "low"}, "async_write_priority: one of"),
        ({"async_idle_max_s": 0}, "async_idle_max_s"),
        ({"async_idle_max_s": float("inf")}, "async_idle_max_s"),
    ],
)
def test_the_priority_settings_are_checked(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CheckpointConfig(**kw)


@needs_restore
def test_a_wait_for_the_write_ends_its_idle_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop stops to wait for the write (``wait``, the next ``save``, ``close``):
    nothing runs beside it any more, the write goes on at the training's priority."""
    from rankguard.checkpoint.background import BackgroundWriter

    seen: list[int] = []
    writing = threading.Event()
    write = BackgroundWriter._write_data

    def spy(self: BackgroundWriter, planner: Any, file_queue: Any) -> Any:
        seen.append(_policy())
        writing.set()
        deadline = time.monotonic() + 30
        while _policy() == os.SCHED_IDLE and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(_policy())
        return write(self, planner, file_queue)

    monkeypatch.setattr(BackgroundWriter, "_write_data", spy)
    model = torch.nn.Linear(16, 16)
    config = CheckpointConfig(
        save=str(tmp_path / "ckpt"), async_save=True, async_write_priority="idle"
    )
    with CheckpointManager(config, {"model": model}, session=False) as m:
        m.save(1)
        assert writing.wait(30)
        t0 = time.monotonic()
        m.wait()
        assert time.monotonic() - t0 < 25  # not the 30 s bound
        assert m.last_committed["persistent"] == 1
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER]


def test_a_writer_waited_for_before_it_writes_never_lowers_its_thread(tmp_path: Path) -> None:
    from rankguard.checkpoint.background import BackgroundWriter

    writer = BackgroundWriter(tmp_path / "w", priority="idle")
    writer.end_idle()  # the wait came first
    seen: list[int] = []
    writer_super = BackgroundWriter.__mro__[1]

    def fake_write(self: Any, plan: Any, planner: Any) -> None:
        seen.append(_policy())

    real = writer_super.write_data
    writer_super.write_data = fake_write  # type: ignore[method-assign]
    try:
        _in_thread(lambda: writer.write_data(None, None))
    finally:
        writer_super.write_data = real  # type: ignore[method-assign]
    assert seen == [os.SCHED_OTHER] and writer.idle is None


def test_the_writer_travels_to_dcps_checkpoint_process(tmp_path: Path) -> None:
    import pickle

    from rankguard.checkpoint.background import BackgroundWriter

    writer = BackgroundWriter(tmp_path / "w", priority="idle", idle_max_s=7.0)
    copy = pickle.loads(pickle.dumps(writer))
    assert (copy.priority, copy.idle_max_s, copy.idle) == ("idle", 7.0, None)
    copy.end_idle()  # its lock works there
