"""The demo's faults: which attempt's loss is NaN; the stop fault's helper."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rankguard.demo.train import inject, inject_nan, parse_args
from rankguard.util.procs import pid_running


def _args(fault: str) -> object:
    return parse_args(["--fault", fault, "--fault-step", "3", "--fault-rank", "2"])


def test_a_bad_gpu_nan_is_gone_in_the_rerun_after_the_resume_whatever_the_restart_count() -> None:
    # an agent that restarted its group for a node waiting to join, before it saw its own
    # rank's exit 16, keeps torch's restart count at 0: the re-run after the resume is
    # another attempt all the same, and a faulty GPU's NaN is not there any more
    args = _args("nan-bad-gpu")
    assert inject_nan(args, 2, 3, 0, rerunning=False)  # the first attempt
    assert inject_nan(args, 2, 3, 0, rerunning=True)  # its re-run in place: the same
    assert not inject_nan(args, 2, 3, 0, rerunning=True, resumed=True)
    assert not inject_nan(args, 2, 3, 1, rerunning=True, resumed=True)
    assert not inject_nan(args, 1, 3, 0, rerunning=False)  # another rank
    assert not inject_nan(args, 2, 4, 0, rerunning=False)  # another step


def test_a_persistent_nan_stays_after_the_resume_and_a_transient_one_is_once() -> None:
    persistent, once = _args("nan-persistent"), _args("nan")
    assert inject_nan(persistent, 2, 3, 1, rerunning=True, resumed=True)
    assert inject_nan(once, 2, 3, 0, rerunning=False)
    assert not inject_nan(once, 2, 3, 0, rerunning=True)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_stop_faults_helper_holds_no_output_and_ends_with_a_killed_rank() -> None:
    # a rank killed while stopped: its SIGCONT helper must neither keep the launcher's
    # output pipe open nor sleep on for the fault's duration (a caller reading the job's
    # output to its end waited that long after the job ended)
    args = parse_args(["--fault", "stop", "--fault-step", "3", "--fault-rank", "0"])
    args.fault_duration = 60.0
    pid = os.fork()
    if pid == 0:  # the rank: stops itself in the fault
        try:
            inject(args, 0, 3, 0, 0)
        finally:
            os._exit(0)
    helper = None
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        (helper,) = _children(pid)
        for fd in (0, 1, 2):
            assert os.readlink(f"/proc/{helper}/fd/{fd}") == os.devnull
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    deadline = time.monotonic() + 5
    while pid_running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = not pid_running(helper)
    if not ended:
        os.kill(helper, signal.SIGKILL)
    assert ended, "the helper outlived the killed rank"
