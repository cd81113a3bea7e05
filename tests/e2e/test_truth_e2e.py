"""End to end: what the console, ``rankguard status`` and ``rankguard report`` say about
a real run whose rank is SIGKILLed from outside and restarted: the restart with its
cause everywhere, the iteration after the resume (the checkpoint's step plus the steps
since, marked as such), the start-up window labelled, the model's dtype. The ranks, the
restarted ones too, are forked from the ``--preload`` fork server (torch and
``torch._dynamo`` imported once, not at each of the four rank starts): what is told is
the subject, not the start; a restart in new interpreters is ``test_checkpoint_e2e.py``'s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

STEPS = 30


def _rank_row(run_dir: Path, rank: int) -> dict | None:
    try:
        status = read_status(run_dir)
    except (OSError, ValueError):
        return None
    return next((r for r in status.get("ranks") or [] if r.get("rank") == rank), None)


def test_a_rank_killed_from_outside_then_restarted_is_told_everywhere(
    tmp_path: Path, run_id: str
) -> None:
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "--preload",
            "torch",
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.num_in_job_restarts=1",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            str(SCRIPTS / "hook_resume.py"),
            "--steps",
            str(STEPS),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
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
        while time.monotonic() < deadline:  # past the second checkpoint (step 6)
            row = _rank_row(run_dir, 1)
            if row and row.get("process_liveness") == "alive" and (row.get("iteration") or 0) >= 8:
                break
            time.sleep(0.2)
        else:
            pytest.fail("rank 1 never reached step 8")
        assert row["iteration_source"] == "steps", row  # no checkpoint loaded yet
        os.kill(row["pid"], signal.SIGKILL)  # from outside: no finding's action
        out, _ = proc.communicate(timeout=150)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert f"[script] done at step {STEPS}" in out

    (restart,) = read_jsonl(run_dir / "restarts.jsonl")
    cause = f"{restart['cause']} rank 1"
    assert restart["cause"] in ("worker_failed", "rank_process_exited"), restart
    # the console: the restart when it happens, and again in the last line
    assert f"[rankguard] restart 1 of the workers: {cause}" in out, out
    (last,) = [ln for ln in out.splitlines() if ln.startswith("[rankguard] run completed: ")]
    assert f"1 restart ({cause}" in last, last
    assert "monitor: state" not in out
    # the first perf window of a loop without a phase ran from start-up: said so
    assert "| first step " in out and "incl. start-up (warm-up)" in out, out

    # status: the script's iteration after the resume, marked as the checkpoint's step
    status = read_status(run_dir)
    assert status["state"] == "completed"
    assert {(r["iteration"], r["iteration_source"]) for r in status["ranks"]} == {
        (STEPS, "checkpoint")
    }
    res = run_rankguard(["status", str(run_dir)], timeout=30)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert f"restarts 1 restart ({cause}" in text, text
    assert f"{STEPS}+" in text and "ITER: + the resumed checkpoint's step plus" in text
    assert "process #1" in text and cause in text
    total = status["summary"]["findings_total"]
    assert f"findings {total} (0 active)" in text

    # report: the restart and its cause in the header and where the findings are
    html_path = tmp_path / "report.html"
    res = run_rankguard(["report", str(run_dir), "-o", str(html_path)], timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    html = html_path.read_text()
    assert "No findings: every rank stayed alive" not in html
    assert f"1 restart ({cause}" in html, html
    findings_file = run_dir / "findings.jsonl"
    if not (findings_file.exists() and read_jsonl(findings_file)):
        assert "No findings from the monitor, but the run restarted 1 time(s)" in html

    # the model's dtype, not the peak column's default
    # (one summary: the restarted attempt took over the one the first attempt left)
    (path,) = (tmp_path / "perf_monitor" / run_id).glob("perf_summary_*.json")
    info = json.loads(path.read_text())["session_info"]
    assert info["dtype"] == "fp32" and info["peak_dtype"] == "bf16", info
    assert no_leftover_workers(run_id)
