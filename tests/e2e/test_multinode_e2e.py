"""Two nodes on loopback, no shared filesystem: node 1's ranks reach node 0's monitor
through the rendezvous store."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import fast_sets, free_port, heartbeat_files, rankguard_cmd, read_jsonl, read_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def test_two_nodes_without_shared_fs_report_a_node1_stall_on_node0(
    tmp_path: Path, run_id: str
) -> None:
    port = free_port()
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    procs = {}
    for node in (0, 1):
        cmd = rankguard_cmd(
            "run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--node-rank",
            str(node),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--log-dir",
            str(logs[node]),
            *fast_sets(),
            "-m",
            "rankguard.demo.train",
            "--steps",
            "40",
            "--step-sleep",
            "0.05",
            "--fault",
            "stall",
            "--fault-node",
            "1",
            "--fault-rank",
            "1",
            "--fault-step",
            "5",
            "--fault-duration",
            "7",
        )
        procs[node] = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    outs = {}
    for node, proc in procs.items():
        try:
            outs[node], _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
    both = "\n".join(f"--- node {n}\n{o}" for n, o in outs.items())
    assert procs[0].returncode == 0 and procs[1].returncode == 0, both

    run0 = logs[0] / "heartbeat" / run_id
    run1 = logs[1] / "heartbeat" / run_id
    # Node 1 wrote only its own ranks; node 0 holds all four (two mirrored).
    assert len(heartbeat_files(run1)) == 2
    assert len(heartbeat_files(run0)) == 4
    assert not (run1 / "status.json").exists()
    node1_ranks = {read_jsonl(f)[0]["rank"] for f in heartbeat_files(run1)}

    found = read_jsonl(run0 / "findings.jsonl")
    assert len(found) == 1, both
    f = found[0]
    assert f["finding_type"] == "gpu_progress_timeout"
    assert f["node_rank"] == 1 and f["local_rank"] == 1
    assert f["rank"] in node1_ranks

    status = read_status(run0)
    assert status["state"] == "completed", both
    assert [r["process_liveness"] for r in status["ranks"]] == ["exited"] * 4
    assert {r["node_rank"] for r in status["ranks"]} == {0, 1}
