"""Two nodes on loopback, fault tolerance on: a rank of node 1 hangs, node 0 finds it and
node 1's relay dumps its stacks with the configured method, then kills it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import free_port, no_leftover_workers, node_run, rankguard_cmd, read_jsonl, run_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def test_hang_on_node1_is_dumped_there_with_the_configured_method_then_killed(
    tmp_path: Path, run_id: str
) -> None:
    port = free_port()
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    cmds = {}
    for node in (0, 1):
        cmds[node] = rankguard_cmd(
            *node_run(node, port, run_id, logs[node]),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            # py-spy is preferred when on PATH; node 1 must use the method configured
            "--set",
            "fault_tolerance.stack_dump=faulthandler",
            "--set",
            "fault_tolerance.stack_dump_timeout_s=5",
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
            "600",
        )
    outs, codes = run_nodes(cmds, timeout_s=75)
    both = "\n".join(f"--- node {n} (exit {codes[n]})\n{o}" for n, o in outs.items())

    run0 = logs[0] / "heartbeat" / run_id
    run1 = logs[1] / "heartbeat" / run_id
    finding = read_jsonl(run0 / "findings.jsonl")[0]
    assert (finding["finding_type"], finding["node_rank"], finding["local_rank"]) == (
        "gpu_progress_timeout",
        1,
        1,
    ), both
    assert finding["action"] == "restart", both
    culprit, pid = finding["rank"], finding["pid"]
    # node 0 holds no dump of a node-1 rank: node 1 took it
    assert finding["stack_dump"].startswith("on node 1"), both
    assert not (run0 / "stacks" / f"rank_{culprit}_pid_{pid}.txt").exists()

    dump = run1 / "stacks" / f"rank_{culprit}_pid_{pid}.txt"
    assert dump.exists(), both
    text = dump.read_text(encoding="utf-8")
    # faulthandler's format (not py-spy's), taken while the rank was still blocked in the
    # injected stall: before the kill
    assert "most recent call first" in text and "py-spy dump" not in text, text
    assert "in inject" in text, text
    out1 = outs[1]
    dumped_at = out1.find(f"rankguard relay: stacks of rank {culprit}: {dump}")
    killed_at = out1.find(f"rankguard relay: killed rank {culprit} (pid {pid}) on request")
    assert 0 <= dumped_at < killed_at, both
    # no restart budget: the hang ends the job with the hang's exit code
    assert codes[0] == 10, both
    assert no_leftover_workers(run_id)
