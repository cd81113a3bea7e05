"""End to end: NVRx 0.7.0's own ``RankMonitorClient`` (the release's files first on the
ranks' ``PYTHONPATH``, see tests/nvrx_release.py) in the Megatron-style script under
``rankguard run`` (2 CPU ranks, gloo): served, no finding when healthy."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.nvrx_release import VERSION, release_env, release_path

from .conftest import (
    SCRIPTS,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def test_nvrx_07_client_healthy_loop_gives_no_finding(tmp_path: Path, run_id: str) -> None:
    path = release_path()
    env = release_env(path, {**os.environ, "PYTHONUNBUFFERED": "1"})
    res = subprocess.run(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "--ft-rank_section_timeouts=setup:60,step:20,checkpointing:30",
            "--ft-rank_out_of_section_timeout=30",
            str(SCRIPTS / "megatron_ft.py"),
            "--save",
            str(tmp_path / "save"),
            "--iters",
            "40",
            "--num-warmup-iters",
            "2",
            "--calc-ft-timeouts",
        ),
        capture_output=True,
        text=True,
        timeout=140,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "done: 40 iterations, restart 0" in out
    assert "'step': 20.0" in out, out  # the launch's timeouts reached 0.7's client
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_jsonl(run_dir / "findings.jsonl") == []
    for rank in (0, 1):
        (hb,) = sorted(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl"))
        nvrx = [r["nvrx"] for r in read_jsonl(hb) if "nvrx" in r]
        assert nvrx and nvrx[-1]["section_events"] > 0, rank
        # 0.7's init message reached the bridge (a 0.4 client sends no warm-up count)
        assert nvrx[-1]["num_warmup_iters"] == 2, (rank, nvrx[-1], VERSION)
        assert not nvrx[-1].get("errors"), nvrx[-1]
    assert read_status(run_dir)["state"] == "completed"
    assert no_leftover_workers(run_id)
