"""End to end: an async checkpoint is the state at the save call. Two ranks under
``rankguard run``, async saves every 2 steps, an EMA-style update in place right after
every save returns; rank 1 dies right after the save of step 6 returns, the job
restarts in place and resumes from step 4: every loss from there equals the loss of an
uninterrupted run at that step, bit for bit."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import SCRIPTS, no_leftover_workers, rankguard_cmd, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCRIPT = str(SCRIPTS / "ema_resume.py")


def run(args: list[str]) -> str:
    res = subprocess.run(
        rankguard_cmd(*args),
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    return out


def losses(out: str) -> list[tuple[int, str]]:
    found = re.finditer(r"\[ema\] step (\d+) loss (\S+)", out)
    return [(int(m.group(1)), m.group(2)) for m in found]


def test_a_crash_right_after_an_async_save_resumes_with_the_uninterrupted_losses(
    tmp_path: Path, run_id: str
) -> None:
    def job(name: str, *extra: str) -> str:
        return run(
            [
                *standalone_run(f"{run_id}-{name}", tmp_path / name, nproc=2),
                "--set",
                "fault_tolerance.enable_ft_package=true",
                "--set",
                "fault_tolerance.num_in_job_restarts=1",
                "--set",
                "fault_tolerance.termination_grace_s=3",
                "--set",
                f"checkpoint.save={tmp_path / name / 'ckpt'}",
                "--set",
                "checkpoint.save_interval=2",
                "--set",
                "checkpoint.async_save=true",
                SCRIPT,
                "--steps",
                "8",
                *extra,
            ]
        )

    reference = dict(losses(job("whole")))
    assert sorted(reference) == list(range(1, 9))
    out = job("crash", "--crash-step", "6")
    assert "[ema] resumed from step 4" in out, out
    seen = losses(out)
    first = seen.index((6, reference[6]))  # the first attempt reached step 6 ...
    again = seen[first + 1 :]  # ... then rank 1 died and the job resumed at step 5
    assert [s for s, _ in again] == [5, 6, 7, 8], seen
    for step, loss in again:
        assert loss == reference[step], (step, loss, reference[step])
    assert "[ema] done: 8 steps" in out
    assert no_leftover_workers(f"{run_id}-crash")
