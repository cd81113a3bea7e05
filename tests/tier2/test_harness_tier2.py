"""The tier-2 harness itself: each fault kind does what ``tests.harness.faults`` says,
and the monitor sees it as it sees a real rank's."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tests.harness import InjectedFault, RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]


def test_a_healthy_job_completes_without_findings(tmp_path: Path) -> None:
    # The group's set-up (3 ranks' gloo connections) within 5 s, as the other jobs here: at
    # 1 s it timed out once on a loaded 2-core CI run. A stall of a step is still a finding
    # here (the 1 s progress timeout), and no finding is what this test asserts.
    res = ThreadedJob(tmp_path, 3, pg_timeout_s=5).run(lambda ctx: ctx.train(10))
    assert res.values() == [10, 10, 10]
    assert res.findings == []
    assert res.status is not None and res.status["state"] == "completed"
    assert {r["rank"]: r["iteration"] for r in res.status["ranks"]} == {0: 10, 1: 10, 2: 10}


def test_raise_fails_the_rank_and_the_agent_names_it_first(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2)
    job.faults.fail_at(1, 3, "raise")
    res = job.run(lambda ctx: ctx.train(10))
    failed = res.outcomes[1]
    assert isinstance(failed.error, InjectedFault) and failed.exit_code == 1
    assert res.outcomes[0].error is not None  # its collective broke: the peer is gone
    assert res.agent.exits[0].rank == 1  # the first to end, before its peer's collective broke
    end = res.heartbeats(1)[-1]
    assert end["event"] == "process_end" and not end["exit"]["clean"]
    assert "injected fault on rank 1 at step 3" in end["exit"]["error"]
    assert 1 in {f["rank"] for f in res.findings}


def test_kill_ends_the_records_without_process_end(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2, pg_timeout_s=5)
    job.faults.fail_at(0, 3, "kill")
    res = job.run(lambda ctx: ctx.train(10))
    assert res.outcomes[0].killed and res.outcomes[0].exit_code == -9
    assert all(r["event"] != "process_end" for r in res.heartbeats(0))


def test_stop_publishing_is_a_heartbeat_timeout_while_training_goes_on(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2, pg_timeout_s=10)
    job.faults.fail_at(1, 2, "stop_publishing")
    # the two threads' 1 s of CPU each, one at a time: 2 s or more, past the 1 s timeout
    res = job.run(lambda ctx: ctx.train(100, step_s=0.01))
    assert res.values() == [100, 100]
    found = [(f["finding_type"], f["rank"]) for f in res.findings]
    assert ("rank_process_heartbeat_timeout", 1) in found, found
    assert 0 not in {f["rank"] for f in res.findings}


def test_nan_replaces_one_loss(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2)
    job.faults.fail_at(0, 4, "nan")

    def train(ctx: RankContext) -> list[float]:
        losses = []

        def on_step(ctx: RankContext, step: int) -> None:
            losses.append(ctx.job.faults.loss(ctx.rank, step, 1.0))

        ctx.train(5, on_step=on_step)
        return losses

    res = job.run(train)
    rank0, rank1 = res.values()
    assert [math.isnan(x) for x in rank0] == [False, False, False, True, False]
    assert rank1 == [1.0] * 5


def test_an_unknown_fault_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fault kind 'hang'"):
        ThreadedJob(tmp_path, 2).faults.fail_at(0, 1, "hang")


def test_a_stepped_monitor_scans_only_when_the_test_says(tmp_path: Path) -> None:
    """``stepped=True``: no scanning thread; each :meth:`ThreadedJob.scan` is one scan,
    made by the test at the moment it chooses (here: before and after a stalled rank's
    progress timeout of 1 s)."""
    job = ThreadedJob(tmp_path, 2, pg_timeout_s=15, stepped=True)
    job.faults.fail_at(1, 5, "stall", seconds=30)
    findings = job.run_dir / "findings.jsonl"
    seen: list[list[tuple[str, int]]] = []

    def drive(job: ThreadedJob) -> None:
        deadline = time.monotonic() + 20
        while not job.faults.fired:  # rank 1 stalls from now on
            assert time.monotonic() < deadline, "rank 1 never reached step 5"
            time.sleep(0.01)
        seen.append([(f["finding_type"], f["rank"]) for f in job.scan()])
        time.sleep(2.0)  # twice the progress timeout, nobody scanning
        assert findings.read_text() == ""
        seen.append([(f["finding_type"], f["rank"]) for f in job.scan()])
        job.faults.release.set()  # rank 1 goes on

    res = job.run(lambda ctx: ctx.train(10), drive=drive)
    assert res.values() == [10, 10]
    assert seen == [[], [("gpu_progress_timeout", 1)]]
    assert [(f["finding_type"], f["rank"]) for f in res.findings] == [("gpu_progress_timeout", 1)]
