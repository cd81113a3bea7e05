"""Agents launched without ``--node-rank`` (as torchrun allows) are numbered by the
rendezvous: distinct node identities, one monitor, every other node relays."""

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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

NODES = 3


def test_nodes_without_node_rank_get_their_identity_from_the_rendezvous(
    tmp_path: Path, run_id: str
) -> None:
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(NODES)}  # agents, not yet nodes
    cmds = {
        a: rankguard_cmd(
            *node_run(None, port, run_id, logs[a], nproc=1, nnodes=NODES),
            "-m",
            "rankguard.demo.train",
            "--steps",
            "40",
            "--step-sleep",
            "0.05",
            "--fault",
            "stall",
            "--fault-node",
            "2",
            "--fault-rank",
            "0",
            "--fault-step",
            "5",
            "--fault-duration",
            "7",
        )
        for a in range(NODES)
    }
    outs, codes = run_nodes(cmds, timeout_s=150)
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

    # One monitor (node 0); the others relayed their ranks to it.
    run0 = node_of[0]
    assert [n for n, d in node_of.items() if (d / "status.json").exists()] == [0]
    assert len(heartbeat_files(run0)) == NODES
    for node in (1, 2):
        (own,) = heartbeat_files(node_of[node])
        assert read_jsonl(own)[0]["node_rank"] == node  # the workers' GROUP_RANK
    status = read_status(run0)
    assert status["state"] == "completed", every
    assert [r["process_liveness"] for r in status["ranks"]] == ["exited"] * NODES
    assert [r["node_rank"] for r in status["ranks"]] == [0, 1, 2]

    # The stall on node 2 is blamed on node 2's rank.
    found = read_jsonl(run0 / "findings.jsonl")
    assert [(f["finding_type"], f["node_rank"], f["local_rank"]) for f in found] == [
        ("gpu_progress_timeout", 2, 0)
    ], every
    (own2,) = heartbeat_files(node_of[2])
    assert found[0]["rank"] == read_jsonl(own2)[0]["rank"]
