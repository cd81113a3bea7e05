"""End to end: the rerun state machine under the real ``rankguard run``, CPU ranks on gloo.

A NaN once is a transient fault (the job completes); a NaN on the first hardware only
exits 16, resumes from the checkpoint (an in-job restart) and exits 17 naming the rank
and its host; a NaN everywhere exits 16, then stops as a data or model problem.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, read_jsonl, read_status, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

VALIDATE = ["--set", "rerun_state_machine.rerun_mode=validate_results"]


def _run(
    tmp_path: Path, run_id: str, fault: str, rank: int, *extra: str, nproc: int = 2
) -> tuple[int, str, Path]:
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path, nproc=nproc),
            *VALIDATE,
            *extra,
            "-m",
            "rankguard.demo.train",
            "--steps",
            "6",
            "--step-sleep",
            "0.01",
            "--fault",
            fault,
            "--fault-step",
            "3",
            "--fault-rank",
            str(rank),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ],
        timeout=150,
    )
    return res.returncode, res.stdout + res.stderr, tmp_path / "heartbeat" / run_id


def _rerun_findings(run_dir: Path) -> list[tuple[str, int, int | None]]:
    return [
        (f["finding_type"], f["rank"], f["iteration"])
        for f in read_jsonl(run_dir / "findings.jsonl")
        if f["finding_type"].startswith("rerun_")
    ]


def test_nan_once_on_one_rank_is_a_transient_fault(tmp_path: Path, run_id: str) -> None:
    """A real launch: the verdict reaches node 0's files from the rank processes."""
    spiky = ["--set", "rerun_state_machine.check_for_spiky_loss=true"]
    spiky += ["--set", "rerun_state_machine.spiky_loss_warmup=2"]
    code, out, run_dir = _run(tmp_path, run_id, "nan", 1, *spiky)
    assert code == 0, out
    assert "[demo] done: 6 steps on 2 rank(s)" in out
    assert _rerun_findings(run_dir) == [("rerun_transient_fault", 1, 3)]
    # both ranks re-ran iteration 3 (rank 0's loss was fine): one re-run each, no other
    for rank in (0, 1):
        last = read_jsonl(next(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl")))[-1]
        assert last["rerun"]["reruns"] == 1, (rank, last["rerun"])
    status = read_status(run_dir)
    assert status["state"] == "completed" and status["rerun"]["reruns"] == 1
    assert no_leftover_workers(run_id)


@pytest.mark.parametrize(("nproc", "rank"), [(2, 1)])
def test_nan_on_the_first_hardware_exits_16_then_17_naming_the_rank(
    tmp_path: Path, run_id: str, nproc: int, rank: int
) -> None:
    """A real launch: exit 16, an in-job restart of the worker processes, exit 17."""
    code, out, run_dir = _run(
        tmp_path, run_id, "nan-bad-gpu", rank, "--max-restarts", "1", nproc=nproc
    )
    assert code == 17, out
    assert _rerun_findings(run_dir) == [
        ("rerun_persistent_fault", rank, 3),
        ("rerun_validation_failed", rank, 3),
    ]
    failed = next(
        f
        for f in read_jsonl(run_dir / "findings.jsonl")
        if f["finding_type"] == "rerun_validation_failed"
    )
    assert failed["faulty_hostname"] == socket.gethostname() and failed["faulty_gpu"] == "cpu"
    assert "[demo] resumed from step 2 (persistent)" in out  # the checkpoint exit 16 saved
    assert f"rank {rank}'s first run was faulty: host {socket.gethostname()}" in out
    assert not list((tmp_path / "ckpt").glob("rerun_state_rank_*"))  # resolved
    assert no_leftover_workers(run_id)


def test_nan_everywhere_exits_16_then_stops_as_a_data_problem(tmp_path: Path, run_id: str) -> None:
    """A real launch: exit 16, a restart, then the launcher stops without spending more."""
    code, out, run_dir = _run(tmp_path, run_id, "nan-persistent", 0, "--max-restarts", "3")
    assert code == 1, out  # not retryable; the restart budget is not spent on it
    assert _rerun_findings(run_dir) == [
        ("rerun_persistent_fault", 0, 3),
        ("rerun_reproducible_fault", 0, 3),
    ]
    assert "1 in-job restart(s) spent" in out
    assert "ReproducibleFaultError" in out
    assert no_leftover_workers(run_id)
