"""End to end: the rerun state machine under the real ``rankguard run``, CPU ranks on gloo.

A NaN on the first hardware only exits 16, resumes from the checkpoint (an in-job
restart) and exits 17 naming the rank and its host.

Elsewhere: every rank re-running the same iteration after a NaN once (a transient fault)
and the verdicts agreed on every rank, ranks as processes
(``tests/unit/rerun/test_agreement.py``); each verdict as one finding on node 0 and the
status's rerun block (``tests/unit/rerun/test_evaluator.py``); a NaN everywhere stopping
as a data or model problem (``tests/unit/rerun/test_machine.py``) without a further
restart (``tests/unit/launcher/test_agent.py``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, read_jsonl, run_rankguard, standalone_run

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


@pytest.mark.parametrize(("nproc", "rank"), [(2, 1)])
def test_nan_on_the_first_hardware_exits_16_then_17_naming_the_rank(
    tmp_path: Path, run_id: str, nproc: int, rank: int
) -> None:
    """A real launch: exit 16, an in-job restart of the worker processes, exit 17. The
    workers and the restarted ones are forked from the ``--preload`` fork server: their
    start-up is not the subject."""
    code, out, run_dir = _run(
        tmp_path,
        run_id,
        "nan-bad-gpu",
        rank,
        *("--max-restarts", "1", "--preload", "torch"),
        nproc=nproc,
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
