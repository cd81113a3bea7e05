"""Two nodes on loopback, no shared filesystem: node 1's ranks reach node 0's monitor
through the rendezvous store."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import (
    free_port,
    heartbeat_files,
    node_run,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_nodes,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def test_two_nodes_without_shared_fs_report_a_node1_stall_on_node0(
    tmp_path: Path, run_id: str
) -> None:
    port = free_port()
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    cmds = {}
    for node in (0, 1):
        cmds[node] = rankguard_cmd(
            *node_run(node, port, run_id, logs[node]),
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
    outs, codes = run_nodes(cmds, timeout_s=120)
    both = "\n".join(f"--- node {n}\n{o}" for n, o in outs.items())
    assert codes[0] == 0 and codes[1] == 0, both

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
