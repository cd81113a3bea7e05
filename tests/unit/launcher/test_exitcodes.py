"""The exit code of ``rankguard run``: every row of the table in ``exitcodes``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.config import load_config
from rankguard.launcher import exitcodes
from rankguard.launcher.exitcodes import (
    EXIT_CRASH,
    EXIT_FAILED,
    EXIT_HANG,
    EXIT_NO_RESTART,
    EXIT_OK,
    EXIT_STRAGGLER,
    EXIT_UNHEALTHY_GPU,
    EXIT_USAGE,
    RETRYABLE,
    JobOutcome,
    exit_code,
    is_hang,
)
from rankguard.launcher.options import LaunchOptions
from rankguard.schema import FindingType, exits

HANGS = [t for t in FindingType if t.info.hang]
NOT_HANGS = [t for t in FindingType if not t.info.hang]


def _table() -> list[tuple[str, str, str]]:
    """(code, name, retry) of each row of the module docstring's table."""
    rows = []
    for line in (exits.__doc__ or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[0] not in ("code", "---"):
            rows.append((cells[0], cells[1].strip("`"), cells[3]))
    return rows


def test_the_table_and_the_constants_agree() -> None:
    rows = _table()
    named = {name: int(code) for code, name, _ in rows if name}
    constants = {n: getattr(exitcodes, n) for n in dir(exitcodes) if n.startswith("EXIT_")}
    assert named == constants
    assert len(set(constants.values())) == len(constants)
    assert {int(code) for code, name, retry in rows if retry.startswith("yes")} == RETRYABLE
    assert [(code, name) for code, name, _ in rows if not name] == [("128+N", "")]


def test_ok() -> None:
    assert exit_code(JobOutcome()) == EXIT_OK
    assert exit_code(JobOutcome(fault_tolerance=True)) == EXIT_OK


def test_failed_without_fault_tolerance_is_not_classified() -> None:
    for cause in [None, "worker_failed", *FindingType]:
        assert exit_code(JobOutcome(failed=True, cause=cause)) == EXIT_FAILED
    assert exit_code(JobOutcome(failed=True, aborted=True)) == EXIT_FAILED


@pytest.mark.parametrize("ftype", HANGS)
def test_a_hang_that_ended_the_job(ftype: FindingType) -> None:
    outcome = JobOutcome(failed=True, fault_tolerance=True, cause=ftype.value)
    assert exit_code(outcome) == EXIT_HANG


def test_the_hangs_are_the_timeouts() -> None:
    assert set(HANGS) == {
        FindingType.PROCESS_TIMEOUT,
        FindingType.PROGRESS_TIMEOUT,
        FindingType.SECTION_TIMEOUT,
    }


@pytest.mark.parametrize("cause", [None, "worker_failed", "a_newer_type", *NOT_HANGS])
def test_any_other_failure_is_a_crash(cause: Any) -> None:
    cause = cause.value if isinstance(cause, FindingType) else cause
    assert not is_hang(cause)
    assert exit_code(JobOutcome(failed=True, fault_tolerance=True, cause=cause)) == EXIT_CRASH


@pytest.mark.parametrize("cause", [None, "rank_process_exited", "gpu_progress_timeout"])
def test_an_abort_spends_no_restart(cause: str | None) -> None:
    outcome = JobOutcome(failed=True, fault_tolerance=True, aborted=True, cause=cause)
    assert exit_code(outcome) == EXIT_NO_RESTART


@pytest.mark.parametrize("ft", [False, True])
def test_a_failure_that_will_repeat_is_not_retried(ft: bool) -> None:
    """The restart decision stopped the job: 18 with or without fault tolerance, below
    the ranks' own rerun codes, and not retryable."""
    outcome = JobOutcome(failed=True, fault_tolerance=ft, will_repeat=True, cause="worker_failed")
    assert exit_code(outcome) == exitcodes.EXIT_WILL_REPEAT == 18
    assert exitcodes.EXIT_WILL_REPEAT not in RETRYABLE
    rerun = JobOutcome(failed=True, fault_tolerance=ft, will_repeat=True, worker_exit=17)
    assert exit_code(rerun) == 17


def test_ranks_stopped_at_one_step() -> None:
    assert exit_code(JobOutcome(stop_at=0)) == EXIT_STRAGGLER
    assert exit_code(JobOutcome(stop_at=120, fault_tolerance=True)) == EXIT_STRAGGLER
    # A failure after the stop was asked for is still the failure.
    failed = JobOutcome(stop_at=120, failed=True, fault_tolerance=True)
    assert exit_code(failed) == EXIT_CRASH


@pytest.mark.parametrize("signum", [1, 2, 15])
def test_a_signal_wins_over_everything(signum: int) -> None:
    assert exit_code(JobOutcome(signal=signum)) == 128 + signum
    everything = JobOutcome(
        signal=signum,
        failed=True,
        fault_tolerance=True,
        aborted=True,
        cause="gpu_progress_timeout",
        stop_at=3,
    )
    assert exit_code(everything) == 128 + signum


def test_usage_conflicting_restart_budgets(tmp_path: Path, capsys: Any) -> None:
    from rankguard.launcher.run import launch

    cfg = load_config(None, [f"log_dir={tmp_path}", "fault_tolerance.num_in_job_restarts=3"])
    assert launch(LaunchOptions(target="t.py", max_restarts=2), cfg) == EXIT_USAGE
    assert "disagree" in capsys.readouterr().err
    assert not (tmp_path / "heartbeat").exists()  # refused before anything started


def test_unhealthy_gpu_refuses_the_node(tmp_path: Path, monkeypatch: Any) -> None:
    import rankguard.launcher.preflight as preflight
    from rankguard.launcher.preflight import preflight_gpu_check

    sick = {"index": 0, "name": "gpu", "uuid": "GPU-0", "health": "unhealthy", "problems": []}
    snapshot = {"status": "unhealthy", "source": "nvml", "gpus": [sick]}
    monkeypatch.setattr(preflight, "collect_gpu_health", lambda **_: snapshot)
    said: list[str] = []
    code = preflight_gpu_check(
        command_timeout_s=1.0, node_rank=0, run_dir=tmp_path, say=said.append
    )
    assert code == EXIT_UNHEALTHY_GPU
    assert said[-1].endswith(f"exit code {EXIT_UNHEALTHY_GPU}")


def test_rerun_codes_pass_through() -> None:
    from rankguard.launcher.exitcodes import EXIT_RERUN_RESUME, EXIT_RERUN_VALIDATION_FAILED

    for ft in (False, True):
        for code in (EXIT_RERUN_RESUME, EXIT_RERUN_VALIDATION_FAILED):
            assert exit_code(JobOutcome(failed=True, fault_tolerance=ft, worker_exit=code)) == code
        other = JobOutcome(failed=True, fault_tolerance=ft, worker_exit=1)
        assert exit_code(other) == (EXIT_CRASH if ft else EXIT_FAILED)
    assert exit_code(JobOutcome(signal=15, failed=True, worker_exit=16)) == 128 + 15
    assert {EXIT_RERUN_RESUME, EXIT_RERUN_VALIDATION_FAILED} <= RETRYABLE
