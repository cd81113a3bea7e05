"""End to end: in-process restart under the real ``rankguard run``, 2 CPU ranks on gloo.

The ranks, and the new ones past the budget, are forked from the ``--preload`` fork
server (torch imported once, not at each of the four rank starts): the launcher's side
of the restarts is the subject, not a rank's start.

Elsewhere: the mechanism (re-entry after an exception, a hang, a dead peer, the budget,
the loss continued), ranks as processes: ``tests/unit/inprocess/test_gloo_ranks.py``; the
monitor's side: ``tests/unit/inprocess/test_monitor.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
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
            "--preload",
            "torch",
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


def test_exception_and_hang_recovered_in_the_same_processes_then_past_the_budget_new_ones(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: the launcher's side of in-process restarts (restarts.jsonl, the
    findings, status.json) for rank processes that stay the same through two re-entries
    (an exception, a hang); past the in-process budget the agent restarts the rank
    processes (new pids, new heartbeat files), which only torch elastic's agent does.
    The mechanism itself (every step once, the loss continued), ranks as processes:
    ``unit/inprocess/test_gloo_ranks``."""
    out, rc = _job(
        tmp_path,
        run_id,
        "--faults",
        "0:1:5:raise,1:0:9:hang,2:1:13:raise",
        sets=(
            "--set",
            "inprocess_restart.max_restarts_per_window=2",
            "--set",
            "fault_tolerance.num_in_job_restarts=1",
        ),
    )
    assert rc == 0, out[-3000:]
    assert "waitForInput" not in out, out[-3000:]  # the ranks' C++ log level, set by `run`
    run_dir = tmp_path / "heartbeat" / run_id
    lines = read_jsonl(run_dir / "restarts.jsonl")
    assert [(x["kind"], x.get("restart"), x["cause"], x["rank"]) for x in lines[:2]] == [
        ("inprocess", 1, "exception", 1),
        ("inprocess", 2, "soft_timeout", 0),
    ]
    assert [x["kind"] for x in lines] == ["inprocess", "inprocess", "process"]
    # the same two processes through both re-entries, two new ones after the budget
    for rank in range(2):
        assert len(list(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl"))) == 2, out[-2000:]
    found = read_jsonl(run_dir / "findings.jsonl")
    assert [(f["finding_type"], f["rank"]) for f in found][:2] == [
        ("inprocess_restart", 1),
        ("inprocess_restart", 0),
    ]
    # the re-entries are not reported as a hang
    assert "gpu_progress_timeout" not in {f["finding_type"] for f in found}, found
    status = read_status(run_dir)
    assert status["inprocess"]["restarts"] == 2
    assert [r["kind"] for r in status["restarts"]] == ["inprocess", "inprocess", "process"]
    for rank in range(2):  # the processes of the second attempt ran clean to the end
        res = json.loads((tmp_path / "out" / f"rank_{rank}.json").read_text())
        assert res["restarts"] == 0 and sorted(map(int, res["losses"])) == list(range(20))
