"""The guard of a rank's process group (``worker.guard_process_group``): a rank's own
children end with it, however it ends; the guard acts only in a group the rank leads,
and outlives the stop signal torch elastic sends the whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rankguard.util.procs import pid_running

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]

RANK = """\
import signal, subprocess, sys, time
from rankguard.launcher.worker import guard_process_group

guard = guard_process_group()
child = subprocess.Popen(["sleep", "300"])
signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(3)))
print(guard.pid if guard else -1, child.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(60)
"""


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while pid_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_running(pid)


def _rank(how: str, *, own_group: bool = True) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, how],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )
    assert proc.stdout is not None
    guard, child = map(int, proc.stdout.readline().split())
    return proc, guard, child


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_the_ranks_child_ends_with_it(how: str) -> None:
    proc, guard, child = _rank(how)
    try:
        assert guard > 0
        if how == "sigkill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _gone(child), "the rank's child outlived it"
        assert _gone(guard)
    finally:
        for pid in (child, guard):
            if pid > 0 and pid_running(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_outlives_the_groups_stop_signal_then_acts() -> None:
    proc, guard, child = _rank("wait")
    try:
        time.sleep(0.3)  # the guard is waiting
        os.killpg(proc.pid, signal.SIGTERM)  # as torch elastic stops a worker
        assert proc.wait(10) == 3  # the rank's own handler ran to its end
        assert _gone(child) and _gone(guard)
    finally:
        for pid in (child, guard):
            if pid_running(pid):
                os.kill(pid, signal.SIGKILL)


def test_no_guard_in_a_group_the_rank_does_not_lead() -> None:
    proc, guard, child = _rank("exit", own_group=False)
    try:
        assert guard == -1  # this test's own group: never signalled
        proc.wait(10)
        assert pid_running(child)
    finally:
        os.kill(child, signal.SIGKILL)
