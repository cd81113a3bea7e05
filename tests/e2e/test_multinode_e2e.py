"""Two nodes on loopback, no shared filesystem, agents launched without ``--node-rank``
(as torchrun allows): the rendezvous numbers them (distinct node identities), node 0
runs the one monitor, and node 1's ranks reach it through the rendezvous store."""

from __future__ import annotations

import json
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

NODES = 2


def test_nodes_numbered_by_the_rendezvous_report_a_node1_stall_on_node0(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: several agents, their identities from the rendezvous, and the
    relay through the store between them."""
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(NODES)}  # agents, not yet nodes
    cmds = {
        a: rankguard_cmd(
            *node_run(None, port, run_id, logs[a], nnodes=NODES),
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
        for a in range(NODES)
    }
    outs, codes = run_nodes(cmds, timeout_s=120)
    every = "\n".join(f"--- agent {a}\n{o}" for a, o in outs.items())
    assert set(codes.values()) == {0}, every
    assert "numbered by the rendezvous" in every

    # Each agent's launcher file names the node the rendezvous gave it: all distinct.
    node_of = {}
    for a in range(NODES):
        (launcher,) = (logs[a] / "heartbeat" / run_id).glob("launcher_node_*.json")
        info = json.loads(launcher.read_text())
        assert info["node_rank_given"] is None
        node_of[info["node_rank"]] = logs[a] / "heartbeat" / run_id
    assert sorted(node_of) == list(range(NODES)), every
    run0, run1 = node_of[0], node_of[1]

    # One monitor (node 0). Node 1 wrote only its own ranks; node 0 holds all four (two
    # mirrored).
    assert [n for n, d in node_of.items() if (d / "status.json").exists()] == [0]
    assert len(heartbeat_files(run1)) == 2
    assert len(heartbeat_files(run0)) == 4
    assert {read_jsonl(f)[0]["node_rank"] for f in heartbeat_files(run1)} == {1}  # GROUP_RANK
    node1_ranks = {read_jsonl(f)[0]["rank"] for f in heartbeat_files(run1)}

    # The stall on node 1 is blamed on node 1's rank.
    found = read_jsonl(run0 / "findings.jsonl")
    assert len(found) == 1, every
    f = found[0]
    assert f["finding_type"] == "gpu_progress_timeout"
    assert f["node_rank"] == 1 and f["local_rank"] == 1
    assert f["rank"] in node1_ranks

    status = read_status(run0)
    assert status["state"] == "completed", every
    assert [r["process_liveness"] for r in status["ranks"]] == ["exited"] * 4
    assert [r["node_rank"] for r in status["ranks"]] == [0, 0, 1, 1]
