"""A rank dies with its launcher: the parent-death signal, the lifeline the heartbeat
thread checks, and what the thread does when the launcher is gone."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankguard.rank import lifeline as lifeline_mod
from rankguard.rank.identity import ENV
from rankguard.rank.lifeline import (
    Lifeline,
    end_orphan,
    launcher_pid,
    pid_alive,
    set_parent_death_signal,
)
from rankguard.rank.publisher import HeartbeatPublisher
from rankguard.rank.timeline import ProgressTracker
from rankguard.util.procs import pid_running
from tests.factories import rank_identity, read_records

LINUX = sys.platform.startswith("linux")
PR_GET_PDEATHSIG = 2


def _pdeathsig_of_child(code: str, env: dict[str, str] | None = None) -> int:
    """Run ``code`` in a child Python, then print its parent-death signal (Linux)."""
    probe = textwrap.dedent(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        out = ctypes.c_int(-1)
        libc.prctl(2, ctypes.byref(out), 0, 0, 0)
        print(out.value)
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code + "\n" + probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().splitlines()[-1])


# ---- the parent-death signal ---------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="prctl is Linux's")
def test_parent_death_signal_is_set_in_the_process() -> None:
    code = (
        "import signal\n"
        "from rankguard.rank.lifeline import set_parent_death_signal\n"
        "assert set_parent_death_signal(signal.SIGKILL) is True\n"
    )
    assert _pdeathsig_of_child(code) == signal.SIGKILL
    assert _pdeathsig_of_child("pass") == 0  # the probe itself sets nothing


def test_no_prctl_elsewhere_is_a_debug_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lifeline_mod.sys, "platform", "darwin")
    with caplog.at_level(logging.DEBUG, logger=lifeline_mod.__name__):
        assert set_parent_death_signal() is False
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "darwin" in caplog.text


def test_a_failing_prctl_is_a_debug_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[object, ...]] = []

    class FakePrctl:
        restype: object = None

        def __call__(self, *args: object) -> int:
            calls.append(args)
            return -1

    class FakeLibc:
        prctl = FakePrctl()

    monkeypatch.setattr(lifeline_mod.sys, "platform", "linux")
    monkeypatch.setattr(lifeline_mod.ctypes, "CDLL", lambda *a, **k: FakeLibc())
    with caplog.at_level(logging.DEBUG, logger=lifeline_mod.__name__):
        assert set_parent_death_signal(signal.SIGKILL) is False
    assert len(calls) == 1
    option, sig = calls[0][:2]
    assert option == 1 and isinstance(sig, ctypes.c_ulong) and sig.value == signal.SIGKILL
    assert "PR_SET_PDEATHSIG" in caplog.text
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


def test_no_libc_is_a_debug_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(*args: object, **kw: object) -> object:
        raise OSError("no libc")

    monkeypatch.setattr(lifeline_mod.sys, "platform", "linux")
    monkeypatch.setattr(lifeline_mod.ctypes, "CDLL", no_libc)
    assert set_parent_death_signal() is False


# ---- the launcher's pid --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("abc", None), ("0", None), ("1", None), ("4242", 4242)],
)
def test_launcher_pid_from_the_environment(value: str | None, expected: int | None) -> None:
    env = {} if value is None else {ENV.LAUNCHER_PID: value}
    assert launcher_pid(env) == expected


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: gone
    assert not pid_alive(child.pid)


def test_a_process_of_another_user_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    def kill(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(lifeline_mod.os, "kill", kill)
    assert pid_alive(12345)


# ---- the lifeline ----------------------------------------------------------------------


def test_no_lifeline_outside_the_launcher() -> None:
    assert Lifeline.from_env({}) is None
    assert Lifeline.from_env({ENV.LAUNCHER_PID: "junk"}, direct_child=True) is None


def test_a_direct_child_keeps_the_launcher_as_its_parent() -> None:
    line = Lifeline.from_env({ENV.LAUNCHER_PID: "4242"}, direct_child=True)
    assert line is not None
    assert (line.launcher_pid, line.parent_pid) == (4242, 4242)


def test_a_forked_rank_keeps_the_parent_it_has() -> None:
    line = Lifeline.from_env({ENV.LAUNCHER_PID: "4242"})
    assert line is not None
    assert (line.launcher_pid, line.parent_pid) == (4242, os.getppid())


class FakeSystem:
    """A parent pid and a set of live pids the test changes."""

    def __init__(self, ppid: int, alive: set[int]) -> None:
        self.ppid = ppid
        self.live = alive
        self.alive_calls: list[int] = []

    def getppid(self) -> int:
        return self.ppid

    def alive(self, pid: int) -> bool:
        self.alive_calls.append(pid)
        return pid in self.live


def test_direct_child_parent_check_only() -> None:
    fake = FakeSystem(ppid=100, alive={100})
    line = Lifeline(launcher_pid=100, parent_pid=100, getppid=fake.getppid, alive=fake.alive)
    assert line.lost() is None
    assert fake.alive_calls == []  # one getppid per beat, no kill(pid, 0)
    fake.ppid = 1  # reparented: the launcher exited (even if its pid is still a zombie)
    assert line.lost() == "the launcher (pid 100) is gone: parent is now pid 1"


def test_forked_rank_checks_the_fork_server_and_the_launcher() -> None:
    fake = FakeSystem(ppid=200, alive={100, 200})
    line = Lifeline(launcher_pid=100, parent_pid=200, getppid=fake.getppid, alive=fake.alive)
    assert line.lost() is None
    assert fake.alive_calls == [100]
    fake.live.discard(100)  # the launcher died, the fork server lives on
    assert line.lost() == "the launcher (pid 100) is gone"
    fake.ppid = 1  # the fork server died too
    assert line.lost() == "the fork server (pid 200) is gone: parent is now pid 1"


def test_end_orphan_kills_itself_with_sigkill(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[tuple[int, int]] = []

    class Killed(Exception):
        pass

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        raise Killed

    with caplog.at_level(logging.ERROR, logger=lifeline_mod.__name__), pytest.raises(Killed):
        end_orphan("the launcher (pid 100) is gone", kill=kill)
    assert sent == [(os.getpid(), signal.SIGKILL)]
    assert len(caplog.records) == 1
    assert "the launcher (pid 100) is gone" in caplog.text


# ---- the heartbeat thread's check ------------------------------------------------------


def _publisher(
    tmp_path: Path, lifeline: Lifeline, on_orphan: Callable[[str], None]
) -> HeartbeatPublisher:
    return HeartbeatPublisher(
        rank_identity(),
        tmp_path,
        ProgressTracker(mode="cpu"),
        0.02,
        lifeline=lifeline,
        on_orphan=on_orphan,
    )


def _wait(cond: object, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_launcher_gone_ends_the_record_stream_then_the_rank(tmp_path: Path) -> None:
    fake = FakeSystem(ppid=100, alive=set())
    orphaned: list[str] = []
    pub = _publisher(
        tmp_path,
        Lifeline(launcher_pid=100, parent_pid=100, getppid=fake.getppid, alive=fake.alive),
        orphaned.append,
    )
    pub.start()
    try:
        assert _wait(lambda: len(read_records(pub.path)) >= 3)  # beats while it is there
        assert orphaned == []
        fake.ppid = 1
        assert _wait(lambda: bool(orphaned))
        assert orphaned == ["the launcher (pid 100) is gone: parent is now pid 1"]
        thread = pub._thread
        assert thread is not None
        thread.join(2)
        assert not thread.is_alive()
        records = read_records(pub.path)
        assert [r["event"] for r in records].count("process_end") == 1
        assert records[-1]["event"] == "process_end"
        assert records[-1]["exit"] == {
            "clean": False,
            "exit_code": -signal.SIGKILL,
            "error": "orphaned: the launcher (pid 100) is gone: parent is now pid 1",
        }
    finally:
        pub.close()  # idempotent: nothing more is written
    assert read_records(pub.path)[-1]["exit"]["clean"] is False


def test_a_broken_check_never_kills_the_rank(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> int:
        raise RuntimeError("no getppid today")

    orphaned: list[str] = []
    pub = _publisher(
        tmp_path, Lifeline(launcher_pid=100, parent_pid=100, getppid=broken), orphaned.append
    )
    pub.start()
    try:
        assert _wait(lambda: len(read_records(pub.path)) >= 4)  # still beating
    finally:
        pub.close()
    assert orphaned == []
    assert "checking the launcher failed" in caplog.text


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_real_orphan_stops_within_a_beat_without_prctl(tmp_path: Path) -> None:
    """A process tree like the launcher's, without the parent-death signal: the middle
    process (the launcher) starts a rank that publishes every 0.1 s, then is SIGKILLed."""
    rank = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from rankguard.rank.lifeline import Lifeline
        from rankguard.rank.timeline import ProgressTracker
        from rankguard.rank.publisher import HeartbeatPublisher
        from tests.factories import rank_identity
        pub = HeartbeatPublisher(
            rank_identity(pid=os.getpid()), Path({str(tmp_path)!r}),
            ProgressTracker(mode="cpu"), 0.1,
            lifeline=Lifeline.from_env(direct_child=True),
        )
        assert pub.lifeline is not None and pub.lifeline.lost() is None
        pub.start()
        print(os.getpid(), flush=True)
        while True:
            time.sleep(1)  # the training loop: never asked anything
        """
    )
    launcher = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = {{**os.environ, {ENV.LAUNCHER_PID!r}: str(os.getpid())}}
        child = subprocess.Popen(
            [sys.executable, "-c", {rank!r}], env=env, stdout=subprocess.PIPE, text=True
        )
        print(child.stdout.readline().strip(), flush=True)
        time.sleep(120)
        """
    )
    root = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        child_pid = int(proc.stdout.readline())
        assert pid_running(child_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        assert _wait(lambda: not pid_running(child_pid), timeout=5.0)
        assert time.monotonic() - t0 < 2.0  # 0.1 s beats
    finally:
        proc.kill()
        if pid_running(child_pid):
            os.kill(child_pid, signal.SIGKILL)
    (path,) = tmp_path.glob("*.heartbeat.jsonl")
    last = read_records(path)[-1]
    assert last["event"] == "process_end"
    assert last["exit"]["error"].startswith("orphaned: the launcher (pid ")
