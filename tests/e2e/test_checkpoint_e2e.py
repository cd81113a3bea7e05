"""End to end: checkpoints through ``rankguard.checkpoint`` under the real launcher.

Two ranks, async saves every 2 steps, an EMA-style update in place right after every
save returns; rank 1 dies right after the save of step 6 returns (its write dies with
it), the launcher restarts the workers and they resume from step 4, the newest complete
checkpoint: the steps done again have the losses of the first attempt, bit for bit (an
async checkpoint is the state at the save call), and status.json says what was
committed and loaded.

Elsewhere, ranks as processes (``tests.factories.run_ranks``): a lost node's local
checkpoints restored from the replicas and the fallback to persistent without them
(``tests/unit/checkpoint/test_ranks.py``); the state at the save call, bit for bit,
with every stager (``tests/unit/checkpoint/test_consistency.py``); a corrupt newest
checkpoint skipped with a warning (``tests/tier2/test_checkpoint_tier2.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCRIPT = str(SCRIPTS / "ema_resume.py")


def losses(out: str) -> list[tuple[int, str]]:
    found = re.finditer(r"\[ema\] step (\d+) loss (\S+)", out)
    return [(int(m.group(1)), m.group(2)) for m in found]


def test_a_crash_right_after_an_async_save_resumes_with_the_same_losses(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: a rank process dies while its async write is in flight, the
    agent reports it, the launcher restarts the worker processes (started without
    ``--preload``) and they load what was committed."""
    res = subprocess.run(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path, nproc=2),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.num_in_job_restarts=1",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            "--set",
            f"checkpoint.save={tmp_path / 'ckpt'}",
            "--set",
            "checkpoint.save_interval=2",
            "--set",
            "checkpoint.async_save=true",
            SCRIPT,
            "--steps",
            "8",
            "--crash-step",
            "6",
        ),
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "Scheduling async checkpoint save at step 4 (persistent)" in out, out
    assert "[ema] resumed from step 4" in out, out
    seen = losses(out)
    first = dict(seen[:6])  # the first attempt: steps 1 to 6, then rank 1 died
    assert [s for s, _ in seen[:6]] == [1, 2, 3, 4, 5, 6], seen
    again = seen[6:]  # the restarted workers: from step 5
    assert [s for s, _ in again] == [5, 6, 7, 8], seen
    for step, loss in again[:2]:  # the steps done again: the first attempt's losses
        assert loss == first[step], (step, loss, first[step])
    assert "[ema] done: 8 steps" in out
    (restart,) = read_jsonl(tmp_path / "heartbeat" / run_id / "restarts.jsonl")
    # the monitor's finding or the agent's failure report, whichever came first
    assert restart["cause"] in ("rank_process_exited", "worker_failed"), restart
    assert restart["rank"] == 1, restart
    ckpt = read_status(tmp_path / "heartbeat" / run_id)["checkpoints"]
    assert ckpt["last_committed"]["persistent"] == 8, ckpt
    assert ckpt["loaded"]["step"] == 4 and ckpt["failures"] == 0, ckpt
    assert no_leftover_workers(run_id)
