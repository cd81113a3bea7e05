"""`rankguard status` tells a frozen status.json of a launcher that is gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from rankguard.cli.status_render import render_status
from rankguard.util.procs import process_start_time
from rankguard.view.runfiles import launcher_gone

HOST = socket.gethostname()


def _status(pid: int, start: int | None, *, state: str = "running", host: str = HOST) -> dict:
    return {
        "run_id": "r",
        "state": state,
        "monitor": {"hostname": host, "pid": pid, "pid_start": start},
    }


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: the pid runs nothing
    return child.pid


def test_a_live_launcher_is_not_gone() -> None:
    me = os.getpid()
    assert launcher_gone(_status(me, process_start_time(me))) is None


def test_a_launcher_whose_pid_no_longer_runs_is_gone() -> None:
    pid = _dead_pid()
    said = launcher_gone(_status(pid, 12345))
    assert said == f"launcher gone (pid {pid} no longer runs: killed?); this status is its last"
    screen = render_status(_status(pid, 12345), [], launcher_gone=said)
    assert said in screen.splitlines()[1]


def test_a_reused_pid_is_gone_too() -> None:
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None
    said = launcher_gone(_status(me, start - 1))
    assert said is not None and "is another process now" in said


def test_final_states_other_hosts_and_odd_values_are_not_judged() -> None:
    pid = _dead_pid()
    for state in ("completed", "failed", "stopped"):
        assert launcher_gone(_status(pid, 1, state=state)) is None
    assert launcher_gone(_status(pid, 1, host="another-host")) is None
    assert launcher_gone(_status(1, None)) is None  # never pid 1 (or 0, -1)
    assert launcher_gone({"state": "running", "monitor": {"pid": "12"}}) is None
    assert launcher_gone({"state": "running"}) is None
