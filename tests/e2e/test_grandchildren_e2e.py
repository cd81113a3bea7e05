"""End to end: the processes a rank starts itself (a ``sleep 300`` per rank) do not
outlive it, whichever way the job ends: a normal end, a rank that crashes, and a
SIGKILL of the launcher (its ranks die with it, and their children with them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import SCRIPTS, rankguard_cmd, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GONE_WITHIN_S = 10.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _children(pid_dir: Path, nproc: int, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [pid_dir / f"child_{r}" for r in range(nproc)]
        if all(f.exists() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    pytest.fail(f"the ranks did not start their children: {sorted(os.listdir(pid_dir))}")


def _gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    return left


def _start(tmp_path: Path, run_id: str, end: str) -> tuple[subprocess.Popen[str], Path]:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # a file, not a pipe: a leaked child holding the launcher's output open must not
    # hide the verdict behind a read that never ends
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            str(SCRIPTS / "with_children.py"),
            "--end",
            end,
            "--pid-dir",
            str(pid_dir),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log.close()
    return proc, pid_dir


def _ends_with_the_job(tmp_path: Path, run_id: str, end: str) -> None:
    proc, pid_dir = _start(tmp_path, run_id, end)
    children: list[int] = []
    try:
        children = _children(pid_dir, 2)
        proc.wait(timeout=90)
        out = (tmp_path / "launcher.log").read_text(errors="replace")
        assert (proc.returncode == 0) == (end == "normal"), out[-3000:]
        left = _gone(children)
        assert not left, f"a rank's child outlived the job ({end} end): {left}\n{out[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_ranks_children_end_with_a_normal_end(tmp_path: Path, run_id: str) -> None:
    _ends_with_the_job(tmp_path, run_id, "normal")


def test_a_ranks_children_end_when_a_rank_crashes(tmp_path: Path, run_id: str) -> None:
    _ends_with_the_job(tmp_path, run_id, "crash")


def test_a_ranks_children_end_when_the_launcher_is_sigkilled(tmp_path: Path, run_id: str) -> None:
    proc, pid_dir = _start(tmp_path, run_id, "never")
    children: list[int] = []
    try:
        children = _children(pid_dir, 2)
        time.sleep(1.0)  # training
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = _gone(children)
        assert not left, f"a rank's child outlived the SIGKILLed launcher: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
