"""End to end: FlagScale's experiment file as FlagScale means it, under ``rankguard
run`` (2 CPU ranks, gloo): ``experiment.envs`` in the ranks' environment, the run's
files under ``<exp_dir>/logs`` where FlagScale puts them (heartbeat files in
``logs/heartbeat/<run_id>/``, the perf summary at
``logs/perf_monitor/perf_summary_<ts>.json``), ``action=run`` and a training override
accepted, the training section said in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import SCRIPTS, fast_sets, no_leftover_workers, rankguard_cmd, read_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_flagscale_experiment_envs_and_exp_dir(tmp_path: Path, run_id: str) -> None:
    shutil.copy(FIXTURES / "flagscale_experiment.yaml", tmp_path / "train.yaml")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    res = subprocess.run(
        rankguard_cmd(
            "run",
            "--config",
            "train.yaml",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--rdzv-id",
            run_id,
            *fast_sets(),
            "action=run",
            "train.data.data_path=../pile_wikipedia_demo/pile_wikipedia_demo",
            str(SCRIPTS / "env_steps.py"),
            "--out",
            str(tmp_path / "env"),
            "--env",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "--env",
            "NCCL_ALGO",
            "--env",
            "NVTE_FWD_LAYERNORM_SM_MARGIN",
        ),
        capture_output=True,
        text=True,
        timeout=140,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        seen = json.loads((tmp_path / "env" / f"rank_{rank}.json").read_text())
        assert seen == {
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "NCCL_ALGO": "Ring",
            "NVTE_FWD_LAYERNORM_SM_MARGIN": "8",
        }, rank
    logs = tmp_path / "outputs" / "logs"  # FlagScale's <exp_dir>/logs
    run_dir = logs / "heartbeat" / run_id
    assert read_status(run_dir)["state"] == "completed"
    for rank in (0, 1):
        assert list(run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl")), rank
    (summary,) = sorted((logs / "perf_monitor").glob("perf_summary_*.json"))
    assert summary.is_symlink()  # to the run's own folder, where it is rewritten
    assert json.loads(summary.read_text())["session_info"]["total_iterations"] == 20
    assert not (tmp_path / "rankguard_logs").exists()
    assert out.count("FlagScale's training section") == 1, out
    assert no_leftover_workers(run_id)
