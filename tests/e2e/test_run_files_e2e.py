"""A run's files are that run's, and complete, however it ends.

Two launches configured by ``PET_*`` variables only, as a Kubeflow PyTorchJob starts
them (no ``--rdzv-id``: torchrun's default run id ``none``, several nodes), into one log
directory: the second (two ranks) is stopped by a SIGTERM to its launcher half-way, which
stops everything without a false finding. Real launches: the files a user reads after
two jobs, a signal to the launcher and what it does to its worker processes (SIGINT:
``test_flightrec_e2e``; SIGKILL: ``test_orphans_e2e``; SIGHUP's shutdown on the agent in
``tests/unit/launcher/test_agent.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    free_port,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _env(log_dir: Path, nproc: int) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "PYTHONUNBUFFERED": "1",
        "PET_NNODES": "1:2",  # several nodes: torchrun's default id is every launch's
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
        "PET_RDZV_CONF": "last_call_timeout=1",
        "PET_LOG_DIR": str(log_dir),
    }


def _launch(log_dir: Path, steps: int, nproc: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        rankguard_cmd(
            "run",
            "perf.log_interval=10",
            "perf.warmup_iterations=2",
            str(SCRIPTS / "steady_steps.py"),
            "--steps",
            str(steps),
        ),
        env=_env(log_dir, nproc),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _last_step(perf_log: Path) -> int:
    lines = read_jsonl(perf_log) if perf_log.is_file() else []
    return int(lines[-1]["step"]) if lines else 0


def _both_ranks_progress(run_dir: Path) -> bool:
    """Both ranks alive and past their first step (the state is "running" as soon as one
    rank is: a slow second rank signalled before its first record is never observed)."""
    if not (run_dir / "status.json").exists():
        return False
    status = read_status(run_dir)
    rows = status["ranks"]
    return (
        status["state"] == "running"
        and len(rows) == 2
        and all(r["process_liveness"] == "alive" and (r["progress_seq"] or 0) > 0 for r in rows)
    )


def _summary(perf: Path) -> dict:
    (path,) = perf.glob("perf_summary_*.json")
    return json.loads(path.read_text())


def test_two_default_id_launches_keep_apart_and_a_stopped_one_is_summed_up(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    first = _launch(log_dir, steps=30)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert "worker store hosted by the agent" not in out  # torch elastic's detail: debug
    (run1,) = [p for p in (log_dir / "heartbeat").iterdir() if not p.is_symlink()]
    assert run1.name.startswith("none-"), run1
    perf1 = log_dir / "perf_monitor" / run1.name
    before = (perf1 / "perf.jsonl").read_bytes()
    assert _last_step(perf1 / "perf.jsonl") == 30, out

    second = _launch(log_dir, steps=100_000, nproc=2)
    try:
        deadline = time.monotonic() + 90
        runs: list[Path] = []
        while time.monotonic() < deadline:
            runs = [p for p in (log_dir / "heartbeat").iterdir() if p != run1]
            runs = [p for p in runs if not p.is_symlink()]
            if (
                runs
                and _last_step(log_dir / "perf_monitor" / runs[0].name / "perf.jsonl") >= 80
                and _both_ranks_progress(runs[0])
            ):
                break
            assert second.poll() is None, second.communicate()[0]
            time.sleep(0.2)
        else:
            pytest.fail("the second run's perf.jsonl did not reach step 80")
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=60)
    finally:
        second.kill()
    (run2,) = runs
    perf2 = log_dir / "perf_monitor" / run2.name
    # each launch has its own directories; the first run's files are as it left them
    assert run2.name.startswith("none-") and run2.name != run1.name, out
    assert os.readlink(log_dir / "heartbeat" / "latest") == run2.name
    assert (perf1 / "perf.jsonl").read_bytes() == before
    steps = [int(line["step"]) for line in read_jsonl(perf2 / "perf.jsonl")]
    assert steps == sorted(steps) and steps[0] == 1, steps
    assert all(json.loads(p.read_text())["run_id"] for p in run2.glob("launcher_node_*.json"))
    # the stopped run's summary covers every step its perf.jsonl has
    info = _summary(perf2)["session_info"]
    stats = _summary(perf2)["final_statistics"]
    assert info["total_iterations"] == steps[-1], (info, steps[-1], out)
    assert info["steps_in_statistics"] >= steps[-1] - 20, info
    assert stats["avg_step_time_ms"] and stats["avg_step_time_ms"] >= 20, stats
    assert _summary(perf1)["session_info"]["total_iterations"] == 30

    # the SIGTERM stopped everything without a false finding
    assert second.returncode == 128 + signal.SIGTERM, out
    assert "Traceback" not in out, out
    assert "closing signal SIGTERM" in out, out
    assert read_jsonl(run2 / "findings.jsonl") == [], out
    status = read_status(run2)
    assert status["state"] == "stopped", out
    assert all(r["process_liveness"] == "exited" for r in status["ranks"]), status["ranks"]
    # the exits the stop caused are no findings, active or not; the monitor was told why
    # the ranks went away; the last line says the run was stopped (the monitor thread
    # itself did not stop on an error)
    assert status["summary"]["findings_active"] == 0
    assert all(r["active_findings"] == [] for r in status["ranks"])
    assert {(r["exit"] or {}).get("after_shutdown") for r in status["ranks"]} == {
        "launcher received SIGTERM"
    }, status["ranks"]
    assert "[rankguard] run stopped by the launcher: 0 finding(s)" in out, out
    assert "monitor: state" not in out
    shown = subprocess.run(
        rankguard_cmd("status", str(run2)), capture_output=True, text=True, timeout=30
    ).stdout
    assert "findings 0 (0 active)" in shown, shown
    assert shown.count("exited (stopped)") == 2 and "exited (err)" not in shown, shown
    assert no_leftover_workers(run2.name)
