"""End to end: the process model of a healthy ``--standalone`` job, one launch, given
FlagScale's experiment file as FlagScale means it (2 CPU ranks, gloo).

The process model: the processes a rank starts itself (a 300 s sleep per rank) end with
the job; every listening socket of the job is on the loopback interface;
``enable_gpu_health_check`` passes on a healthy GPU and the job's ranks run. The other
ways a job ends, with the same children: a rank that crashes
(``test_run_e2e::test_crash_names_the_failing_rank_as_root_cause``) and a SIGKILL of the
launcher (``test_orphans_e2e``). The refusal on an unhealthy GPU is tested in-process in
``tests/tier2/test_preflight_tier2.py``.

FlagScale's experiment file: ``experiment.envs`` in the ranks' environment, the run's
files under ``<exp_dir>/logs`` where FlagScale puts them (heartbeat files in
``logs/heartbeat/<run_id>/``, the perf summary at
``logs/perf_monitor/perf_summary_<ts>.json``), ``action=run`` and a training override
accepted, the training section said in one line.

Why a real launch: processes (each rank's own child, the launcher's and the ranks'
listening sockets), the health check the launcher runs before it starts them, and the
files a user reads where FlagScale's layout puts them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.factories import SICK_GPU

from .conftest import (
    SCRIPTS,
    fast_sets,
    no_leftover_workers,
    outliving,
    rank_children,
    rankguard_cmd,
    read_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FAKE_BIN = Path(__file__).parents[1] / "fakes" / "bin"
FIXTURES = Path(__file__).parent.parent / "fixtures"


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return (
        host.startswith("127.")
        or host == "[00000000000000000000000001000000]"  # ::1
        or (host.startswith("[0000000000000000ffff0000") and host[25:27] == "7f")
    )


def test_a_healthy_standalone_flagscale_job_on_loopback_whose_ranks_children_end_with_it(
    tmp_path: Path, run_id: str
) -> None:
    pid_dir, listeners = tmp_path / "pids", tmp_path / "listeners.json"
    pid_dir.mkdir()
    shutil.copy(FIXTURES / "flagscale_experiment.yaml", tmp_path / "train.yaml")
    healthy = {**SICK_GPU, "ecc.errors.uncorrected.volatile.total": "0"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FAKE_SMI_") and k != "CUDA_DEVICE_MAX_CONNECTIONS"
    }
    env["PATH"] = f"{FAKE_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_SMI_GPUS"] = json.dumps([healthy])
    env["PYTHONUNBUFFERED"] = "1"
    # a file, not a pipe: a leaked child holding the launcher's output open must not
    # hide the verdict behind a read that never ends
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(
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
            "enable_gpu_health_check=true",
            str(SCRIPTS / "env_steps.py"),
            "--out",
            str(tmp_path / "env"),
            "--env",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "--env",
            "NCCL_ALGO",
            "--env",
            "NVTE_FWD_LAYERNORM_SM_MARGIN",
            "--pid-dir",
            str(pid_dir),
            "--listeners",
            str(listeners),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env,
    )
    log.close()
    children: list[int] = []
    try:
        children = rank_children(pid_dir, 2)
        proc.wait(timeout=120)
        out = (tmp_path / "launcher.log").read_text(errors="replace")
        assert proc.returncode == 0, out[-3000:]
        left = outliving(children)
        assert not left, f"a rank's child outlived the job (normal end): {left}\n{out[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    # the GPU health check passed before the ranks (which ran: their children above)
    assert "1 GPU(s) ok via nvidia-smi" in out, out[-3000:]
    # --standalone: the launcher's rendezvous store and the round's worker store at least,
    # every one on loopback
    found = json.loads(listeners.read_text())
    assert len(found) >= 2, found
    assert all(_loopback(str(s["local"])) for s in found), found

    # FlagScale's experiment file: its envs in every rank, its exp_dir as the log root
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
