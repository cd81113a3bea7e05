"""End to end: what a user reads last after a failure or a stop (the console, status.json,
``rankguard status``) is true. A rank that leaves early, a ``@record`` script that raises,
a SIGTERM to the launcher, a hang that fault tolerance ends with no restart left: each
ends in a final state, with a root cause that agrees with the findings."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    leftover_processes,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FINAL = ("completed", "failed", "stopped")


def _status_screen(run_dir: Path) -> str:
    shown = run_rankguard(["status", str(run_dir)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "launcher gone" not in shown.stdout and "killed?" not in shown.stdout, shown.stdout
    return shown.stdout


def _rankguard_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[rankguard] ")]


def test_a_rank_that_leaves_early_ends_failed_with_it_named(tmp_path: Path, run_id: str) -> None:
    res = run_rankguard(
        [*standalone_run(run_id, tmp_path), str(SCRIPTS / "leave_early.py")], timeout=150
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_status(run_dir)["state"] == "failed", out
    assert "[rankguard] run failed: 1 finding(s)" in out, out
    (finding,) = read_jsonl(run_dir / "findings.jsonl")
    assert (finding["rank"], finding["exit"]["peers_ended_first"]) == (0, [1]), finding
    (cause,) = [line for line in _rankguard_lines(out) if "root cause:" in line]
    assert cause.startswith("[rankguard] root cause: rank 1 left the job early"), out
    assert "state failed" in _status_screen(run_dir)


def test_a_record_script_that_raises_gets_torchruns_summary(tmp_path: Path, run_id: str) -> None:
    res = run_rankguard(
        [*standalone_run(run_id, tmp_path), str(SCRIPTS / "record_raise.py")], timeout=150
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    # torchrun's block, from torch elastic's own ChildFailedError, then the verdict
    block = out[out.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:") :]
    root = block[block.index("Root Cause (first observed failure):") :]
    assert "record_raise.py FAILED" in block, out
    assert "  rank      : 1 (local_rank: 1)" in root and "  exitcode  : 1 (pid: " in root, out
    assert "  error_file: " in root and "  traceback : Traceback" in root, out
    assert "  ValueError: bad batch at step 3" in root, out
    # the script's frames only, in the block and in the rank's own traceback
    frames = [line for line in out.splitlines() if 'File "' in line]
    assert any("record_raise.py" in line for line in frames), out
    assert not any("launcher/worker.py" in line or "runpy" in line for line in frames), out
    assert block.index("ChildFailedError") < block.index("[rankguard] root cause: "), out
    assert "[rankguard] root cause: rank 1 (pid " in block, out
    assert "exited with code 1: ValueError: bad batch at step 3" in block, out
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_status(run_dir)["state"] == "failed"
    assert "state failed" in _status_screen(run_dir)


def test_a_sigterm_ends_stopped_with_an_empty_findings_file(tmp_path: Path, run_id: str) -> None:
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path), "-m", "rankguard.demo.train", "--steps", "100000"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run_dir = tmp_path / "heartbeat" / run_id
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if read_status(run_dir)["state"] == "running":
                    break
            time.sleep(0.2)
        # tools tail it from the start of a run, before any finding
        assert (run_dir / "findings.jsonl").read_bytes() == b""
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        for pid in leftover_processes(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert read_status(run_dir)["state"] == "stopped", out
    assert "[rankguard] run stopped by the launcher: 0 finding(s)" in out, out
    assert "root cause" not in out, out
    assert "state stopped" in _status_screen(run_dir)


def test_a_hang_ended_by_fault_tolerance_without_restarts(tmp_path: Path, run_id: str) -> None:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.num_in_job_restarts=0",
            str(SCRIPTS / "skip_allreduce.py"),
        ],
        timeout=150,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 10, out  # a hang ended the job
    run_dir = tmp_path / "heartbeat" / run_id
    status = read_status(run_dir)
    assert status["state"] == "failed", out
    for row in status["ranks"]:  # nothing restarted: no row says it did
        assert "after_restart" not in (row["exit"] or {}), row
    (hang,) = read_jsonl(run_dir / "findings.jsonl")
    assert (hang["finding_type"], hang["rank"]) == ("gpu_progress_timeout", 1), hang
    # the root cause is the hang found, not the SIGKILL fault tolerance sent for it
    lines = _rankguard_lines(out)
    i = next(i for i, line in enumerate(lines) if "root cause:" in line)
    assert lines[i].startswith("[rankguard] root cause: rank 1 (pid "), out
    assert "gpu_progress_timeout: alive but no step completed" in lines[i], out
    assert "exit code -9 (SIGKILL) is fault tolerance's kill" in lines[i + 1], out
    screen = _status_screen(run_dir)
    assert "state failed" in screen and "(restart)" not in screen, screen
