"""End to end: the real ``rankguard run`` CLI, 2 CPU ranks on gloo, short timeouts."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rankguard.schema.layout import PERF_JOB_FILE

from .conftest import (
    HEALTHY_RUN,
    SCRIPTS,
    HealthyRun,
    heartbeat_files,
    kill_all,
    no_leftover_workers,
    outliving,
    rank_children,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def demo(tmp_path: Path, run_id: str, *train_args: str, nproc: int = 2) -> tuple[Path, str]:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=nproc),
            "-m",
            "rankguard.demo.train",
            *train_args,
        ]
    )
    out = res.stdout + res.stderr
    run_dir = tmp_path / "heartbeat" / run_id
    assert run_dir.is_dir(), out
    return run_dir, out


def findings(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "findings.jsonl")


def _status_screen(run_dir: Path) -> str:
    shown = run_rankguard(["status", str(run_dir)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "launcher gone" not in shown.stdout and "killed?" not in shown.stdout, shown.stdout
    return shown.stdout


@HEALTHY_RUN
def test_normal_run_has_no_findings_and_ends_completed(healthy_run: HealthyRun) -> None:
    """The shared healthy run (``conftest.healthy_run``: 20 steps, the perf monitor and
    the trackers on, checkpoints every 10): no finding, every rank completed, and the
    last lines say so and where the files are, as after the README's ``rankguard demo``
    (the demo's module with the demo's timeouts; what ``rankguard demo`` asks the
    launcher for: ``tests/unit/cli/test_demo_cli.py``). A real launch: the files a user
    reads after a job, and ``rankguard status`` on them."""
    tmp_path, run_id, run_dir, out = (
        healthy_run.log_dir,
        healthy_run.run_id,
        healthy_run.run_dir,
        healthy_run.out,
    )
    assert healthy_run.res.returncode == 0, out
    assert "[demo] done: 20 steps on 2 rank(s)" in out, out
    assert "[rankguard] run completed: 0 finding(s)" in out, out
    assert f"rankguard status {run_dir}" in out and f"rankguard report {run_dir}" in out, out
    assert findings(run_dir) == []
    status = read_status(run_dir)
    assert status["state"] == "completed", out
    assert [(r["rank"], r["process_liveness"], r["gpu_progress"]) for r in status["ranks"]] == [
        (0, "exited", "completed"),
        (1, "exited", "completed"),
    ]
    assert all(r["iteration"] == 20 for r in status["ranks"])
    files = heartbeat_files(run_dir)
    assert len(files) == 2
    for f in files:
        events = [r["event"] for r in read_jsonl(f)]
        assert events[0] == "process_start" and events[-1] == "process_end"
        assert "heartbeat" in events
    assert no_leftover_workers(run_id)
    # the run directory is 0750; rank 0's perf run names its job
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o750
    marker = json.loads((tmp_path / "perf_monitor" / run_id / PERF_JOB_FILE).read_text())
    assert marker["job"] == "rankguard.demo.train", marker
    # the launcher started node 0's Prometheus exporter on loopback and stopped it with the
    # job (what it serves: tests/tier2/test_prometheus_tier2.py)
    if importlib.util.find_spec("prometheus_client") is not None:
        endpoint = json.loads((run_dir / "metrics_endpoint.json").read_text())
        assert endpoint["host"] == "127.0.0.1" and endpoint["port"] > 0, endpoint
        assert endpoint["active"] is False, endpoint
    shown = run_rankguard(["status", str(tmp_path)], timeout=30)
    assert shown.returncode == 0 and "completed" in shown.stdout, shown.stderr
    as_json = run_rankguard(["status", "--json", str(run_dir)], timeout=30)
    assert json.loads(as_json.stdout)["status"]["run_id"] == run_id


@HEALTHY_RUN
def test_the_node_health_checks_of_a_healthy_machine_pass(healthy_run: HealthyRun) -> None:
    """``node_health.enabled`` on this machine: its NIC links and the log directory's
    storage checked before the workers start, written beside the GPU health file, and
    no finding (the test above)."""
    run_dir = healthy_run.run_dir
    assert healthy_run.res.returncode == 0, healthy_run.out
    written = json.loads((run_dir / "node_health_node_0.json").read_text())
    assert written["status"] == "ok", written
    checks = {(c["check"], c["target"]) for c in written["checks"]}
    assert ("storage", str(healthy_run.log_dir)) in checks, written
    assert all(c["ok"] for c in written["checks"])
    assert read_status(run_dir)["node_health"]["status"] == "ok"
    assert "node health: " in healthy_run.out and "check(s) passed" in healthy_run.out


def test_crash_names_the_failing_rank_as_root_cause(tmp_path: Path, run_id: str) -> None:
    """A real launch: torch elastic's error file and the agent's exit codes name the
    root cause, across processes; a script with torch elastic's usual entry point
    (``@record``) gets torchrun's failure summary (the root cause, its error file and
    traceback, the script's frames only) before rankguard's verdict; the processes each
    rank started itself (a 300 s sleep) end with the failed job; on a machine without
    ``nvidia-smi`` (nothing but the interpreter's directory on ``PATH``)
    ``enable_gpu_health_check`` says the check is unavailable and the job is launched."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_SMI_")}
    env["PATH"] = os.path.dirname(sys.executable)  # no nvidia-smi at all
    env["PYTHONUNBUFFERED"] = "1"
    # a file, not a pipe: a leaked child holding the launcher's output open must not
    # hide the verdict behind a read that never ends
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "enable_gpu_health_check=true",
            str(SCRIPTS / "with_children.py"),
            "--end",
            "crash",
            "--pid-dir",
            str(pid_dir),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    log.close()
    children: list[int] = []
    try:
        children = rank_children(pid_dir, 2)
        proc.wait(timeout=90)
        out = (tmp_path / "launcher.log").read_text(errors="replace")
        left = outliving(children)
        assert not left, f"a rank's child outlived the job (crash): {left}\n{out[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_all(children)
    assert "GPU health check: unavailable" in out, out[-3000:]
    run_dir = tmp_path / "heartbeat" / run_id
    assert proc.returncode == 1, out[-3000:]
    found = findings(run_dir)
    assert [(f["finding_type"], f["rank"], f["reason"]) for f in found] == [
        ("rank_process_exited", 1, "rank_process_exited_with_error")
    ], out[-3000:]
    assert "rank 1 fails here" in found[0]["exit"]["error"]
    # torchrun's block, from torch elastic's own ChildFailedError, then the verdict
    block = out[out.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:") :]
    root = block[block.index("Root Cause (first observed failure):") :]
    assert "with_children.py FAILED" in block, out[-3000:]
    assert "  rank      : 1 (local_rank: 1)" in root and "  exitcode  : 1 (pid: " in root, root
    assert "  error_file: " in root and "  traceback : Traceback" in root, root
    assert "  RuntimeError: rank 1 fails here" in root, root
    # the script's frames only, in the block and in the rank's own traceback
    frames = [line for line in out.splitlines() if 'File "' in line]
    assert any("with_children.py" in line for line in frames), out[-3000:]
    assert not any("launcher/worker.py" in line or "runpy" in line for line in frames), frames
    assert block.index("ChildFailedError") < block.index("[rankguard] root cause: "), block
    assert "[rankguard] root cause: rank 1 (pid " in block, block
    assert "exited with code 1: RuntimeError: rank 1 fails here" in block, block
    assert read_status(run_dir)["state"] == "failed"
    assert "state failed" in _status_screen(run_dir)
    assert no_leftover_workers(run_id)


def test_a_paused_rank_is_a_heartbeat_timeout_and_no_progress_finding_after_it_resumes(
    tmp_path: Path, run_id: str
) -> None:
    """SIGSTOP then SIGCONT one rank with the progress timeout below the process timeout:
    its late heartbeats are not "alive and not progressing", and once continued it steps
    again (the stopped time is not time without progress). A real launch: a stopped
    process (heartbeat thread included) and the monitor's process-state check."""
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            "--set",
            "heartbeat.process_timeout_s=5",
            "--set",
            "heartbeat.progress_timeout_s=3",
            "-m",
            "rankguard.demo.train",
            "--steps",
            "60",
            "--step-sleep",
            "0.1",
            "--fault",
            "stop",
            "--fault-rank",
            "1",
            "--fault-step",
            "5",
            "--fault-duration",
            "8",
        ],
        timeout=100,
    )
    out = res.stdout + res.stderr
    run_dir = tmp_path / "heartbeat" / run_id
    found = findings(run_dir)
    assert [(f["finding_type"], f["rank"]) for f in found] == [
        ("rank_process_heartbeat_timeout", 1)
    ], out
    assert found[0]["reason"] == "rank_process_or_heartbeat_thread_unresponsive"
    assert found[0]["process_liveness"] == "stale"
    assert "[demo] done: 60 steps on 2 rank(s)" in out, out
    assert read_status(run_dir)["state"] == "completed", out
