"""End to end: live recovery under the real ``rankguard run`` (4 CPU ranks on gloo, the
demo model in DDP, deterministic data): a SIGKILLed rank taken over by a standby in
place, then a second one with no standby left (the group restart, said); a script that
declares no state; a healthy run with a standby.

Why a real launch: only the agent's own watch of the worker processes, the standby
processes and the ranks' in-process rounds together show that the survivors keep their
pids and the job goes on without a group restart."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    heartbeat_files,
    no_leftover_workers,
    read_jsonl,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LIVE = [
    "--set",
    "inprocess_restart.enabled=true",
    "--set",
    "inprocess_restart.soft_timeout=3",
    "--set",
    "inprocess_restart.hard_timeout=20",
    # gloo: a survivor waiting on the lost rank in a ring collective is released by
    # the group's timeout (docs/live_recovery.md)
    "--set",
    "inprocess_restart.process_group_timeout=2",
    "--set",
    "inprocess_restart.heartbeat_interval=0.2",
    "--set",
    "inprocess_restart.heartbeat_timeout=3",
]
_LOSS = re.compile(r"\[demo\] step (\d+)/\d+ loss (\S+)")


def _job(tmp_path: Path, run_id: str, nproc: int, *args: str) -> tuple[str, int, Path]:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=nproc),
            "--standby-ranks",
            "1",
            "--max-restarts",
            "1",
            *LIVE,
            "-m",
            "rankguard.demo.train",
            "--log-every",
            "1",
            "--step-sleep",
            "0.05",
            *args,
        ],
        timeout=280,
    )
    return res.stdout + res.stderr, res.returncode, tmp_path / "heartbeat" / run_id


def _attempts(out: str) -> list[dict[int, float]]:
    """Rank 0's loss per step, one dict per attempt (the steps start again at 1)."""
    attempts: list[dict[int, float]] = [{}]
    last = 0
    for step_s, loss_s in _LOSS.findall(out):
        step = int(step_s)
        if step < last - 1:  # a new attempt (an in-process redo goes back one at most)
            attempts.append({})
        attempts[-1][step] = float(loss_s)
        last = step
    return attempts


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_killed_rank_is_replaced_in_place_then_no_standby_left_restarts(
    tmp_path: Path, run_id: str
) -> None:
    out, rc, run_dir = _job(
        tmp_path, run_id, 4, "--steps", "20", "--kill-at", "2:6", "--kill-at", "1:13"
    )
    assert rc == 0, out[-4000:]
    lines = read_jsonl(run_dir / "restarts.jsonl")
    assert [line["kind"] for line in lines] == ["live_recovery", "process"], lines
    live, group = lines
    assert (live["lost_rank"], live["cause"]) == (2, "rank_process_exited")
    assert live["resumed_t"] is not None and live["resumed_t"] > live["fault_t"]
    assert live["steps_redone"] <= 1 and live["resumed_step"] == 7
    assert group["rank"] == 1
    assert "live recovery: rank 2 (pid " in out and "is taken over by standby pid" in out
    assert (
        "live recovery cannot apply: rank 1 (SIGKILL) lost and no standby left on this "
        "node: the worker group restarts" in out
    )
    # the finding naming the lost rank is written, as without live recovery
    findings = read_jsonl(run_dir / "findings.jsonl")
    assert any(
        f["finding_type"] == "rank_process_exited"
        and f["rank"] == 2
        and f["pid"] == live["lost_pid"]
        for f in findings
    ), findings
    # the survivors kept their pids; the standby's pid became rank 2
    files = {p.name: _records(p) for p in heartbeat_files(run_dir)}
    lived_through = {
        recs[0]["rank"]: recs[0]["pid"]
        for recs in files.values()
        if any(
            ((r.get("inprocess") or {}).get("last") or {}).get("cause") == "rank_lost" for r in recs
        )
    }
    assert sorted(lived_through) == [0, 1, 2, 3], sorted(files)
    assert lived_through[2] == live["standby_pid"]
    by_pid = {recs[0]["pid"]: recs for recs in files.values()}
    for rank in (0, 1, 3):  # the same process before the fault and after the recovery
        steps = {r.get("iteration") or 0 for r in by_pid[lived_through[rank]]}
        assert min(steps - {0}) < 6 < max(steps), (rank, sorted(steps))
    newcomer = {r.get("iteration") or 0 for r in by_pid[live["standby_pid"]]}
    assert min(newcomer - {0}) >= 7, sorted(newcomer)  # it never trained before it took over
    # the losses of the live attempt are an uninterrupted run's (the attempt after the
    # group restart ran from step 1 without a fault)
    first, second = _attempts(out)
    assert sorted(first) == list(range(1, 14)), first
    assert sorted(second) == list(range(1, 21)), second
    for step, loss in first.items():
        assert math.isclose(loss, second[step], rel_tol=1e-3), (step, loss, second[step])
    status = json.loads((run_dir / "status.json").read_text())
    assert status["live"]["standbys_per_node"] == 1
    assert no_leftover_workers(run_id)


def test_a_script_without_declared_state_restarts_the_group_saying_why(
    tmp_path: Path, run_id: str
) -> None:
    out, rc, run_dir = _job(
        tmp_path, run_id, 2, "--steps", "10", "--kill-at", "1:4", "--no-live-state"
    )
    assert rc == 0, out[-4000:]
    said = [line for line in out.splitlines() if "live recovery cannot apply" in line]
    assert said == [
        "[rankguard] live recovery cannot apply: rank 1 (SIGKILL) lost, but the script "
        "declares no live state (rankguard.inprocess.live_state): a standby could not "
        "get it: the worker group restarts"
    ]
    lines = read_jsonl(run_dir / "restarts.jsonl")
    assert [line["kind"] for line in lines] == ["process"]


def test_a_healthy_run_with_a_standby_shows_no_standby_activity(
    tmp_path: Path, run_id: str
) -> None:
    out, rc, run_dir = _job(tmp_path, run_id, 2, "--steps", "8")
    assert rc == 0, out[-4000:]
    assert "live recovery" not in out
    assert not (run_dir / "findings.jsonl").exists() or not read_jsonl(run_dir / "findings.jsonl")
    assert not (run_dir / "restarts.jsonl").exists() or not read_jsonl(run_dir / "restarts.jsonl")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["live"] == {  # the standby left with the ranks, unused
        "standbys_per_node": 1,
        "waiting": 0,
        "left_unused": 1,
        "used": 0,
        "replaced": [],
    }
    assert status["summary"]["findings_total"] == 0
    assert sorted(p.name.split("_pid_")[0] for p in heartbeat_files(run_dir)) == [
        "rank_0",
        "rank_1",
    ]  # the standby wrote no heartbeat
    assert no_leftover_workers(run_id)
