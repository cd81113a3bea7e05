"""Two nodes on loopback: a client of the rendezvous store forges a kill request for a
process that is not one of node 1's workers; node 1's relay refuses it, the process
lives on and the job completes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from rankguard.schema.layout import PERF_JOB_FILE, StoreKeys

from .conftest import fast_sets, free_port, no_leftover_workers, rankguard_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def _wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_forged_kill_request_for_a_non_worker_is_refused(tmp_path: Path, run_id: str) -> None:
    from torch.distributed import TCPStore

    port = free_port()
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    procs: dict[int, subprocess.Popen[str]] = {}
    outs = {n: tmp_path / f"node{n}.out" for n in (0, 1)}
    try:
        for node in (0, 1):
            cmd = rankguard_cmd(
                "run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                run_id,
                "--log-dir",
                str(logs[node]),
                *fast_sets(),
                "--set",
                "fault_tolerance.enable_ft_package=true",
                "-m",
                "rankguard.demo.train",
                "--steps",
                "25",
                "--step-sleep",
                "0.05",
            )
            with outs[node].open("w") as out:
                procs[node] = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
        run1 = logs[1] / "heartbeat" / run_id
        assert _wait_for(lambda: any(run1.glob("rank_*.heartbeat.jsonl")), 45), "node 1 idle"

        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        key = StoreKeys(run_id).kill(1)
        forged = [
            {"rank": 1, "pid": victim.pid, "kill": True},
            {"rank": 1, "pid": -1, "kill": True},
        ]
        client.set(key, json.dumps(forged))
        assert _wait_for(lambda: not client.check([key]), 10), "the relay never served it"

        codes = {n: p.wait(timeout=100) for n, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        alive = victim.poll() is None
        victim.kill()
        victim.wait(timeout=10)
    both = "\n".join(f"--- node {n}\n{outs[n].read_text()}" for n in (0, 1))
    assert alive, both
    assert codes == {0: 0, 1: 0}, both
    out1 = outs[1].read_text()
    assert f"refused to kill rank 1 (pid {victim.pid}) on request" in out1, both
    assert "refused to kill rank 1 (pid -1) on request" in out1, both
    assert "killed rank" not in out1, both
    # the run directories are 0750; rank 0's perf run names its job
    run0 = logs[0] / "heartbeat" / run_id
    assert stat.S_IMODE(os.stat(run0).st_mode) == 0o750
    marker = json.loads((logs[0] / "perf_monitor" / run_id / PERF_JOB_FILE).read_text())
    assert marker["job"] == "rankguard.demo.train", marker
    assert no_leftover_workers(run_id)
