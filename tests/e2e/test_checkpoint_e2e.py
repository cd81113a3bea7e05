"""End to end: the demo's checkpoints through ``rankguard.checkpoint`` under the real
launcher: a crash resumes from the newest complete checkpoint and the loss continues;
a lost node's local directory is restored from its replicas. A corrupt newest
checkpoint skipped with a warning: ``tests/tier2/test_checkpoint_tier2.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    free_port,
    no_leftover_workers,
    node_run,
    rankguard_cmd,
    read_status,
    run_nodes,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DEMO = ["-m", "rankguard.demo.train", "--log-every", "1", "--step-sleep", "0.02"]


def losses(out: str) -> dict[int, list[str]]:
    """Every ``[demo] step N/M loss X`` line's loss, by step (a rerun step twice)."""
    found: dict[int, list[str]] = {}
    for m in re.finditer(r"\[demo\] step (\d+)/\d+ loss (\S+)", out):
        found.setdefault(int(m.group(1)), []).append(m.group(2))
    return found


def run(args: list[str], timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        rankguard_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_a_crash_resumes_from_the_newest_checkpoint_and_the_loss_continues(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: a rank process crashes, the launcher restarts the workers and the
    demo resumes from what the async save committed."""
    nproc = 2  # 4 ranks: the two-agent test below
    res = run(
        [
            *standalone_run(run_id, tmp_path, nproc=nproc),
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
            *DEMO,
            "--steps",
            "8",
            "--fault",
            "crash",
            "--fault-rank",
            "1",
            "--fault-step",
            "6",
        ]
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "Scheduling async checkpoint save at step 4 (persistent)" in out
    # the save of step 4 may still be in flight when rank 1 crashes in step 6 (async):
    # then step 2 is the newest complete one (the save of 4 waited for it)
    resumed = re.search(r"\[demo\] resumed from step (\d+) \(persistent\) \(restart 1\)", out)
    assert resumed is not None and int(resumed.group(1)) in (2, 4), out
    seen = losses(out)
    for step in range(int(resumed.group(1)) + 1, 6):  # the steps done again: same loss
        assert len(seen[step]) == 2 and seen[step][0] == seen[step][1], seen
    assert f"[demo] done: 8 steps on {nproc} rank(s)" in out
    run_dir = tmp_path / "heartbeat" / run_id
    ckpt = read_status(run_dir)["checkpoints"]
    assert ckpt["last_committed"]["persistent"] == 8 and ckpt["failures"] == 0
    assert ckpt["loaded"]["step"] == int(resumed.group(1))
    assert no_leftover_workers(run_id)


def test_a_lost_nodes_local_checkpoints_come_back_from_the_replicas(
    tmp_path: Path, run_id: str
) -> None:
    """Two agents on loopback, 2 ranks each, each node its own local directory; every
    step a local checkpoint replicated to the other node. Node 1's directory is deleted
    between two jobs: the second job restores ranks 2 and 3 from node 0's replicas. A
    real launch: two agents, each node's own directory."""

    def job(rid: str, steps: int) -> dict[int, str]:
        port = free_port()
        cmds = {
            node: rankguard_cmd(
                *node_run(node, port, rid, tmp_path / f"logs{node}"),
                *DEMO,
                "--steps",
                str(steps),
                "--local-checkpoint-dir",
                str(tmp_path / f"local{node}"),
                "--local-checkpoint-every",
                "1",
                "--replication",
                "2",
            )
            for node in (0, 1)
        }
        outs, codes = run_nodes(cmds, timeout_s=150)
        assert codes == {0: 0, 1: 0}, outs
        return outs

    job(run_id, 4)
    held = sorted(os.listdir(tmp_path / "local0" / "step_000000004"))
    assert held == ["shard_0_on_0", "shard_1_on_1", "shard_2_on_0", "shard_3_on_1"]
    shutil.rmtree(tmp_path / "local1")
    outs = job(run_id + "-b", 6)
    both = outs[0] + outs[1]
    assert "[demo] resumed from step 4 (local)" in outs[0], both
    for rank, holder in ((2, 0), (3, 1)):
        assert f"rank {rank}'s shard restored from the replica on rank {holder}" in both
    assert "[demo] done: 6 steps on 4 rank(s)" in outs[0]
    status = json.loads(
        (tmp_path / "logs0" / "heartbeat" / (run_id + "-b") / "status.json").read_text()
    )
    assert status["checkpoints"]["last_committed"]["local"] == 6
