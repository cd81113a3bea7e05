"""End to end: live recovery with no standby left under the real ``rankguard run``
(``--preload torch``, 4 CPU ranks on gloo, the demo model in DDP, one standby, no
refill, ``inprocess_restart.shrink_when_no_standby``): rank 2 is SIGKILLed (the standby
takes it), then rank 1 with no standby left: the job goes on with 3 ranks in process,
renumbered (old 2 is rank 1, old 3 rank 2), the global batch kept by the batch rule (4
micro-batches per rank instead of 3), no group restart.

Why a real launch: only the agent's watch of the workers, the fork server's standby and
the ranks' rounds together show that the survivors keep their processes through a
shrink. That the losses after it are those of a data-parallel job of the same global
batch is checked step by step in ``tests/tier2/test_live_shrink_tier2.py`` (the demo's
data is drawn per rank, so a run of 3 ranks from the start would not be the same)."""

from __future__ import annotations

import json
import math
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
from .test_live_recovery_e2e import _LOSS, LIVE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_no_standby_left_the_job_goes_on_with_three_ranks(tmp_path: Path, run_id: str) -> None:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=4),
            "--preload",
            "torch",
            "--standby-ranks",
            "1",
            "--max-restarts",
            "1",
            *LIVE,
            *("--set", "inprocess_restart.standby_refills=0"),
            *("--set", "inprocess_restart.shrink_when_no_standby=true"),
            "-m",
            "rankguard.demo.train",
            *("--log-every", "1", "--step-sleep", "0.05", "--steps", "20"),
            *("--global-batch", "24", "--batch-size", "2"),
            *("--kill-at", "2:5", "--kill-at", "1:12"),
        ],
        timeout=280,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    run_dir = tmp_path / "heartbeat" / run_id
    lines = read_jsonl(run_dir / "restarts.jsonl")
    # no group restart, and no second in-process restart after the standby joined (the
    # demo's gradient accumulation once ran a DDP forward before its no_sync micro-batches:
    # the round the standby joined then failed in its first backward)
    assert [line["kind"] for line in lines] == ["live_recovery", "live_recovery"], lines
    replaced, shrunk = lines
    assert (replaced["lost_rank"], replaced["exit"]) == (2, "SIGKILL")
    assert not replaced.get("shrink") and replaced["standby_pid"] is not None
    assert (shrunk["lost_rank"], shrunk["exit"], shrunk["shrink"]) == (1, "SIGKILL", True)
    assert shrunk["standby_pid"] is None
    assert (shrunk["world_size"], shrunk["world_size_before"]) == (3, 4)
    assert shrunk["renumbered"] == {"2": 1, "3": 2}
    assert shrunk["resumed_t"] is not None and shrunk["resumed_t"] > shrunk["fault_t"]
    assert shrunk["resumed_step"] == 13 and shrunk["steps_redone"] == 0
    assert (
        f"live recovery: rank 1 (pid {shrunk['lost_pid']}, SIGKILL) lost and no standby left "
        "on this node: the job goes on with 3 of 4 rank(s) in process "
        "(inprocess_restart.shrink_when_no_standby; renumbered: 2->1, 3->2); no group restart"
    ) in out
    assert "live recovery 2: rank 1 dropped, the job goes on with 3 rank(s)" in out
    assert "the worker group restarts" not in out
    status = json.loads((run_dir / "status.json").read_text())["live"]
    assert (status["used"], status["world_size"]) == (1, 3), status
    assert [(r["lost_rank"], r["standby_pid"]) for r in status["shrunk"]] == [(1, None)]
    # the batch rule keeps the global batch: 3 micro-batches of 2 on 4 ranks, 4 on 3
    assert "[demo] batch plan: 4 rank(s), 3 micro-batch(es) of 2 per step, global batch 24" in out
    assert "[demo] batch plan: 3 rank(s), 4 micro-batch(es) of 2 per step, global batch 24" in out
    assert "[demo] done: 20 steps on 3 rank(s)" in out
    losses: dict[int, float] = {}
    for step, loss in _LOSS.findall(out):
        losses[int(step)] = float(loss)
    assert sorted(losses) == list(range(1, 21)) and all(map(math.isfinite, losses.values()))
    # the finding naming the lost rank, as without live recovery
    findings = read_jsonl(run_dir / "findings.jsonl")
    exits = {(f["rank"], f["pid"]) for f in findings if f["finding_type"] == "rank_process_exited"}
    assert {(2, replaced["lost_pid"]), (1, shrunk["lost_pid"])} <= exits, findings
    # the survivors kept their processes through both recoveries (heartbeats keep the
    # rank's first number); the standby trained as rank 2 from step 6 on
    by_pid = {recs[0]["pid"]: recs for recs in map(_records, heartbeat_files(run_dir))}

    def steps_of(pid: int) -> set[int]:
        return {r.get("iteration") or 0 for r in by_pid[pid]} - {0}

    kept = [
        pid
        for pid, recs in by_pid.items()
        if pid != replaced["standby_pid"] and recs[0]["rank"] in (0, 3)
    ]
    assert sorted(by_pid[pid][0]["rank"] for pid in kept) == [0, 3], sorted(by_pid)
    for pid in kept:
        assert min(steps_of(pid)) <= 5 and max(steps_of(pid)) > 13, sorted(steps_of(pid))
    assert max(steps_of(replaced["standby_pid"])) > 13
    assert no_leftover_workers(run_id)
