"""The rank bootstrap and ``--preload``'s fork server tie themselves to the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankguard.bootstrap import session_from_env
from rankguard.config import RankguardConfig, dumps_config
from rankguard.launcher import forkserver_guard, worker
from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.identity import ENV
from rankguard.rank.lifeline import Lifeline
from rankguard.rank.runenv import RunEnv
from rankguard.session import NullSession, Session

LINUX = sys.platform.startswith("linux")


class Calls:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def prctl(self, sig: int = signal.SIGKILL) -> bool:
        self.seen.append(f"prctl {int(sig)}")
        return True

    def end(self, reason: str) -> None:
        self.seen.append(f"end {reason}")
        raise SystemExit("ended")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    fake = Calls()
    monkeypatch.setattr(worker, "set_parent_death_signal", fake.prctl)
    monkeypatch.setattr(worker, "end_orphan", fake.end)
    return fake


def test_outside_the_launcher_nothing_is_set(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    monkeypatch.delenv(ENV.LAUNCHER_PID, raising=False)
    assert worker.hold_launcher(direct_child=True) is None
    assert calls.seen == []


def test_a_direct_child_of_a_live_launcher_is_held(
    monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    monkeypatch.setenv(ENV.LAUNCHER_PID, str(os.getppid()))
    line = worker.hold_launcher(direct_child=True)
    assert isinstance(line, Lifeline)
    assert (line.launcher_pid, line.parent_pid) == (os.getppid(), os.getppid())
    assert calls.seen == [f"prctl {int(signal.SIGKILL)}"]


def test_a_launcher_gone_before_the_prctl_ends_the_rank(
    monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    # our parent is not the launcher the environment names: it died and we were reparented
    monkeypatch.setenv(ENV.LAUNCHER_PID, str(os.getppid() + 100_000))
    with pytest.raises(SystemExit, match="ended"):
        worker.hold_launcher(direct_child=True)
    assert calls.seen[0] == f"prctl {int(signal.SIGKILL)}"  # set first, then checked
    assert calls.seen[1].startswith("end the launcher (pid ")


def test_a_forked_rank_keeps_its_parent(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    monkeypatch.setenv(ENV.LAUNCHER_PID, str(os.getpid()))  # alive; parent: the fork server
    line = worker.hold_launcher(direct_child=False)
    assert line is not None and line.parent_pid == os.getppid()
    assert calls.seen == [f"prctl {int(signal.SIGKILL)}"]


def test_the_session_publisher_gets_the_lifeline(tmp_path: Path) -> None:
    # a launcher that is always there: the heartbeat thread must never end this process
    line = Lifeline(launcher_pid=10, parent_pid=10, getppid=lambda: 10, alive=lambda pid: True)
    cfg = RankguardConfig(heartbeat=HeartbeatConfig(enabled=True))
    cfg.perf.enabled = False
    env = RunEnv.from_environ(
        {ENV.LAUNCHER: "1", ENV.RUN_DIR: str(tmp_path), ENV.CONFIG: dumps_config(cfg)}
    )
    session = session_from_env(env, lifeline=line)
    try:
        assert isinstance(session, Session) and session.publisher is not None
        assert session.publisher.lifeline is line
    finally:
        session.close()
    # outside the launcher: the no-op session, nothing to check
    assert isinstance(session_from_env(RunEnv.from_environ({}), lifeline=line), NullSession)


def test_the_fork_server_guard_needs_the_launcher_as_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV.LAUNCHER_PID, raising=False)
    assert forkserver_guard.guard_fork_server() is False
    monkeypatch.setenv(ENV.LAUNCHER_PID, str(os.getppid() + 100_000))
    assert forkserver_guard.guard_fork_server() is False


def _pdeathsig_after_import(launcher_pid: str) -> int:
    code = textwrap.dedent(
        """
        import ctypes
        import rankguard.launcher.forkserver_guard
        out = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(out), 0, 0, 0)  # PR_GET_PDEATHSIG
        print(out.value)
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, ENV.LAUNCHER_PID: launcher_pid},
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


@pytest.mark.skipif(not LINUX, reason="prctl is Linux's")
def test_the_fork_server_dies_with_the_launcher() -> None:
    assert _pdeathsig_after_import(str(os.getpid())) == signal.SIGKILL  # we are its parent
    assert _pdeathsig_after_import(str(os.getpid() + 100_000)) == 0  # not under the launcher
