"""End to end: the log directory's disk fills up mid-run (a small tmpfs, filled by the
test) with fault tolerance on. The ranks' heartbeats cannot be written, so they go
stale: the job reports ``node_disk_full`` and kills nobody; once space is back the
heartbeats resume and the queued findings are written. The disk fills up again and the
ranks end while it is full: their last records cannot be written, and they are not
reported dead. The rules themselves: ``tests/unit/monitor/test_disk_rules.py``."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    heartbeat_files,
    leftover_processes,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Room for the run's own files (heartbeats, status, perf) until the test fills it.
TMPFS_SIZE = "4m"
FULL_FOR_S = 7.0  # > process_timeout_s (3 s in FAST) + a few scans


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tiny tmpfs as the log directory; unmounted at the end."""
    mnt = tmp_path / "logs"
    mnt.mkdir()
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs for a full disk: {exc}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full disk: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path) -> None:
    """Write ``path`` until not one more byte fits on its disk."""
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 16, 4096, 1):
            block = b"\0" * size
            try:
                while fh.write(block):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


def _training_started(run_dir: Path) -> bool:
    try:
        status: dict[str, Any] = read_status(run_dir)
    except (OSError, ValueError):
        return False
    ranks = status.get("ranks") or []
    return len(ranks) == 2 and all((r.get("iteration") or 0) >= 5 for r in ranks)


def _iterations(run_dir: Path) -> list[int]:
    try:
        status: dict[str, Any] = read_status(run_dir)
    except (OSError, ValueError):
        return []
    return [r.get("iteration") or 0 for r in status.get("ranks") or []]


def _workers_gone(run_id: str, launcher_pid: int) -> bool:
    return [p for p in leftover_processes(run_id) if p != launcher_pid] == []


def test_full_disk_is_reported_not_killed_and_ranks_ending_on_it_are_not_dead(
    small_disk: Path, run_id: str
) -> None:
    """A real launch: with fault tolerance on, a stale heartbeat would kill and restart
    rank processes; a full disk must not (one process per rank throughout). Rank
    processes whose pids vanish without a last record are told apart from dead ones by
    their exit codes, which only the agent has."""
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, small_disk),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.num_in_job_restarts=2",
            "--set",
            "fault_tolerance.stack_dump=faulthandler",
            "-m",
            "rankguard.demo.train",
            # steps of at least 0.2 s: the first fill comes after step 5, the disk is
            # full for 7 s (35 steps at most), the heartbeats resume within a scan or
            # two: the ranks are still training when it fills up again (25 steps, 5 s
            # or more left), and end soon after. Half the steps of 0.1 s each over the
            # same time: a step's compute is most of a demo rank's CPU after its start
            "--steps",
            "70",
            "--step-sleep",
            "0.2",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run_dir = small_disk / "heartbeat" / run_id
    filler = small_disk / "filler.bin"
    try:
        deadline = time.monotonic() + 40
        while not _training_started(run_dir):
            assert proc.poll() is None, "the run ended before training started"
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        # 1: full for longer than the process timeout, then space again
        _fill(filler)
        assert os.statvfs(small_disk).f_bavail == 0
        before = _iterations(run_dir)
        time.sleep(FULL_FOR_S)
        assert proc.poll() is None, "the run ended while the disk was full"
        filler.unlink()
        deadline = time.monotonic() + 20
        while not all(a > b for a, b in zip(_iterations(run_dir), before, strict=True)):
            assert proc.poll() is None, "the run ended before its heartbeats resumed"
            assert time.monotonic() < deadline, "the heartbeats did not resume"
            time.sleep(0.2)
        # 2: full again; the training ends while it is
        _fill(filler)
        deadline = time.monotonic() + 60
        while not _workers_gone(run_id, proc.pid):
            assert time.monotonic() < deadline, "the ranks did not end"
            time.sleep(0.1)
        # space again, as a rule before the launcher's final status (a loaded machine
        # may let the launcher end first: checked below against the status's own time)
        unlink_started = time.time()
        filler.unlink()
        unlinked = time.time()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()

    assert proc.returncode == 0, out
    assert "[demo] done" in out
    findings = read_jsonl(run_dir / "findings.jsonl")
    types = [f["finding_type"] for f in findings]
    assert "node_disk_full" in types, out
    assert "rank_process_heartbeat_timeout" not in types, out
    assert "rank_process_exited" not in types, out
    for f in findings:
        if f["finding_type"] == "node_disk_full":
            assert f["action"] == "report"
            assert f["disk"]["full"] is True
    assert not (run_dir / "restarts.jsonl").exists()
    # Each rank's stack file is opened at its start; none was written to.
    assert all(f.stat().st_size == 0 for f in (run_dir / "stacks").glob("*"))
    assert len(heartbeat_files(run_dir)) == 2  # one process per rank: nobody restarted
    status = read_status(run_dir)
    assert [r["process_liveness"] for r in status["ranks"]] == ["exited", "exited"]
    for row in status["ranks"]:
        assert "full disk" in (row["exit"] or {}).get("on_full_disk", ""), out
    assert status["state"] == "completed"
    monitor = status["monitor"]
    assert monitor["write_errors"] + monitor["status_write_errors"] > 0
    assert monitor["unwritten_findings"] == 0
    assert monitor["last_write_error"]
    # the final status says how the run left the disk: measured again as it is written
    written = datetime.fromisoformat(status["updated_wall_time"]).timestamp()
    if written > unlinked + 1.0:  # written well after the space came back
        assert status["disks"]["0"]["full"] is False, status["disks"]
    elif written < unlink_started:  # the launcher ended while the disk was still full
        assert status["disks"]["0"]["full"] is True, status["disks"]
    assert no_leftover_workers(run_id)
