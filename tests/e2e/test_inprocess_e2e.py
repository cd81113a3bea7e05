"""End to end: in-process restart under the real ``rankguard run``, 2 CPU ranks on gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    heartbeat_files,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

INPROC = [
    "--set",
    "inprocess_restart.enabled=true",
    "--set",
    "inprocess_restart.soft_timeout=2",
    "--set",
    "inprocess_restart.hard_timeout=10",
    "--set",
    "inprocess_restart.monitor_thread_interval=0.1",
    "--set",
    "inprocess_restart.heartbeat_interval=0.2",
    "--set",
    "inprocess_restart.heartbeat_timeout=3",
]


def _job(tmp_path: Path, run_id: str, *args: str, sets: tuple[str, ...] = ()) -> tuple[str, int]:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            *INPROC,
            *sets,
            str(SCRIPTS / "inprocess_train.py"),
            "--out",
            str(tmp_path / "out"),
            "--step-s",
            "0.1",
            *args,
        ],
        timeout=140,
    )
    return res.stdout + res.stderr, res.returncode


def test_exception_and_hang_recovered_in_the_same_processes(tmp_path: Path, run_id: str) -> None:
    """A real launch: the launcher's side of in-process restarts (restarts.jsonl, the
    findings, status.json) for rank processes that stay the same (one heartbeat file
    each); the mechanism itself, ranks as processes: ``unit/inprocess/test_gloo_ranks``."""
    out, rc = _job(tmp_path, run_id, "--faults", "0:1:5:raise,1:0:9:hang")
    assert rc == 0, out[-3000:]
    run_dir = tmp_path / "heartbeat" / run_id
    assert len(heartbeat_files(run_dir)) == 2, out[-2000:]  # same two processes throughout
    lines = read_jsonl(run_dir / "restarts.jsonl")
    assert [(x["kind"], x["restart"], x["cause"], x["rank"]) for x in lines] == [
        ("inprocess", 1, "exception", 1),
        ("inprocess", 2, "soft_timeout", 0),
    ]
    found = read_jsonl(run_dir / "findings.jsonl")
    assert [(f["finding_type"], f["rank"]) for f in found] == [
        ("inprocess_restart", 1),
        ("inprocess_restart", 0),
    ]  # the re-entry is not reported as a hang
    status = read_status(run_dir)
    assert status["inprocess"]["restarts"] == 2
    assert [r["kind"] for r in status["restarts"]] == ["inprocess", "inprocess"]
    for rank in range(2):
        res = json.loads((tmp_path / "out" / f"rank_{rank}.json").read_text())
        assert res["restarts"] == 2 and sorted(map(int, res["losses"])) == list(range(20))


def test_past_the_budget_the_launcher_restarts_the_processes(tmp_path: Path, run_id: str) -> None:
    """A real launch: past the in-process budget the agent restarts the rank processes
    (new pids, new heartbeat files), which only torch elastic's agent does."""
    out, rc = _job(
        tmp_path,
        run_id,
        "--faults",
        "0:1:3:raise,1:0:6:raise",
        sets=(
            "--set",
            "inprocess_restart.max_restarts_per_window=1",
            "--set",
            "fault_tolerance.num_in_job_restarts=1",
        ),
    )
    assert rc == 0, out[-3000:]
    run_dir = tmp_path / "heartbeat" / run_id
    kinds = [x["kind"] for x in read_jsonl(run_dir / "restarts.jsonl")]
    assert kinds == ["inprocess", "process"]
    assert len(heartbeat_files(run_dir)) == 4  # the second attempt: two new processes


def _demo(tmp_path: Path, run_id: str, *train: str) -> tuple[str, int]:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            *INPROC,
            # No hang in this job: a soft timeout of 5 s, not 2, so that a main thread held
            # 2 s in one C call on a loaded machine (the process group's first connect, the
            # first backward) is no restart that takes the crash's place. The survivor
            # then waits about 5 s in its broken collective (the group's timeout on gloo).
            "--set",
            "inprocess_restart.soft_timeout=5",
            "--set",
            "inprocess_restart.hard_timeout=12",
            "-m",
            "rankguard.demo.train",
            "--steps",
            "20",
            "--step-sleep",
            "0",
            *train,
        ],
        timeout=140,
    )
    return res.stdout + res.stderr, res.returncode


def _final_loss(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("[demo] step 20/20")]
    assert lines, out[-2000:]
    return lines[-1]


def test_demo_crash_recovered_in_process_with_the_loss_of_a_clean_run(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: the demo's default process group torn down and rebuilt inside the
    same rank processes; its final loss against a clean launch's."""
    clean, rc = _demo(tmp_path / "clean", run_id + "-c")
    assert rc == 0, clean[-2000:]
    out, rc = _demo(tmp_path / "crash", run_id, "--fault", "crash", "--fault-step", "5")
    assert rc == 0, out[-2000:]
    said = "\n".join(x for x in out.splitlines() if x.startswith(("[demo", "rankguard:")))
    assert "in-process restart 1: resuming at step 6" in out, said
    assert "waitForInput" not in out, out[-3000:]  # the ranks' C++ log level, set by `run`
    assert _final_loss(out) == _final_loss(clean)  # same data, same weights: continuous
    lines = read_jsonl(tmp_path / "crash" / "heartbeat" / run_id / "restarts.jsonl")
    assert [(x["kind"], x["cause"], x["rank"]) for x in lines] == [("inprocess", "exception", 1)]
