"""Two nodes on loopback, no shared filesystem, agents launched without ``--node-rank``
(as torchrun allows), fault tolerance on: the rendezvous numbers them (distinct node
identities), node 0 runs the one monitor, node 1's ranks reach it through the
rendezvous store; a rank of node 1 (rank 3) skips an all-reduce and hangs, node 0 finds
it, names it from every node's collectives and from every node's flight-recorder traces
(node 1's sent through the store; the job's rank number, not its local one, the
collective and its sequence number), and node 1's relay dumps its stacks
with the configured method, then kills it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankguard.ft.flightrec import available

from .conftest import (
    SCRIPTS,
    free_port,
    heartbeat_files,
    no_leftover_workers,
    node_run,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_nodes,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

NODES = 2


def test_nodes_numbered_by_the_rendezvous_a_node1_hang_found_on_node0_dumped_on_node1(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: several agents, their identities from the rendezvous, the relay
    through the store between them, a hang across agents read on node 0, and node 1's
    relay dumping and killing its own rank on node 0's request. The ranks are forked
    from each node's ``--preload`` fork server (a fresh start of several agents' ranks:
    ``test_spares_e2e``)."""
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(NODES)}  # agents, not yet nodes
    cmds = {
        a: rankguard_cmd(
            *node_run(None, port, run_id, logs[a], nnodes=NODES),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            # py-spy is preferred when on PATH; node 1 must use the method configured
            "--set",
            "fault_tolerance.stack_dump=faulthandler",
            "--set",
            "fault_tolerance.stack_dump_timeout_s=5",
            # each node's two ranks forked from its fork server (torch imported once per
            # node, without torch._dynamo: the script builds no optimizer); how a rank
            # starts is not the subject here
            "--preload",
            "torch.distributed",
            str(SCRIPTS / "node_skip_allreduce.py"),
            "--skip-rank",
            "3",  # node 1's second rank: it never joins step 6's all-reduce
        )
        for a in range(NODES)
    }
    outs, codes = run_nodes(cmds, timeout_s=120)
    every = "\n".join(f"--- agent {a} (exit {codes[a]})\n{o}" for a, o in outs.items())
    assert "numbered by the rendezvous" in every

    # Each agent's launcher file names the node the rendezvous gave it: all distinct.
    node_of = {}
    agent_of = {}
    for a in range(NODES):
        (launcher,) = (logs[a] / "heartbeat" / run_id).glob("launcher_node_*.json")
        info = json.loads(launcher.read_text())
        assert info["node_rank_given"] is None
        node_of[info["node_rank"]] = logs[a] / "heartbeat" / run_id
        agent_of[info["node_rank"]] = a
    assert sorted(node_of) == list(range(NODES)), every
    run0, run1 = node_of[0], node_of[1]

    # One monitor (node 0). Node 1 wrote only its own ranks; node 0 holds all four (two
    # mirrored).
    assert [n for n, d in node_of.items() if (d / "status.json").exists()] == [0]
    assert len(heartbeat_files(run1)) == 2
    assert len(heartbeat_files(run0)) == 4
    assert {read_jsonl(f)[0]["node_rank"] for f in heartbeat_files(run1)} == {1}  # GROUP_RANK
    node1_ranks = {read_jsonl(f)[0]["rank"] for f in heartbeat_files(run1)}

    # The hang on node 1 is blamed on node 1's rank, once.
    found = read_jsonl(run0 / "findings.jsonl")
    assert len(found) == 1, every
    finding = found[0]
    assert (finding["finding_type"], finding["node_rank"], finding["local_rank"]) == (
        "gpu_progress_timeout",
        1,
        1,
    ), every
    assert finding["rank"] in node1_ranks
    assert finding["action"] == "restart", every
    culprit, pid = finding["rank"], finding["pid"]
    # node 0 holds no dump of a node-1 rank: node 1 took it
    assert finding["stack_dump"].startswith("on node 1"), every
    assert not (run0 / "stacks" / f"rank_{culprit}_pid_{pid}.txt").exists()

    if available():  # the ranks' flight recorder traces, taken before the kill
        hang = finding["hang"]
        assert hang["kind"] == "did_not_join" and hang["missing_ranks"] == [culprit], hang
        waiting = sorted(set(range(2 * NODES)) - {culprit})
        assert hang["waiting_ranks"] == waiting and hang["op"] == "all_reduce", hang
        assert f"rank(s) {culprit} did not join all_reduce #{hang['seq']}" in finding["message"]
        traces = run0 / "flightrec"
        assert (traces / "rank_0.json").exists() and (traces / "rank_1.json").exists(), every
        # node 1's traces, dumped on node 1 and sent through the store, compared with
        # node 0's: node 0's own ranks both wait in the all-reduce, node 1's show who not
        fr = finding["flight_recorder"]
        assert fr["missing_ranks"] == [culprit] and fr["seq"] == hang["seq"], fr
        assert fr["ranks_read"] == list(range(2 * NODES)) and fr["waiting_ranks"] == waiting
        assert f"flight recorder: rank(s) {culprit} did not join all_reduce" in finding["message"]
        assert (run1 / "flightrec" / f"rank_{culprit}.json").exists(), every

    dump = run1 / "stacks" / f"rank_{culprit}_pid_{pid}.txt"
    assert dump.exists(), every
    text = dump.read_text(encoding="utf-8")
    # faulthandler's format (not py-spy's), taken while the rank was still blocked in the
    # injected stall: before the kill
    assert "most recent call first" in text and "py-spy dump" not in text, text
    script = (SCRIPTS / "node_skip_allreduce.py").read_text().splitlines()
    line = 1 + next(i for i, ln in enumerate(script) if "time.sleep(600)" in ln)
    assert f'node_skip_allreduce.py", line {line} in <module>' in text, text  # in its sleep
    out1 = outs[agent_of[1]]
    dumped_at = out1.find(f"rankguard relay: stacks of rank {culprit}: {dump}")
    killed_at = out1.find(f"rankguard relay: killed rank {culprit} (pid {pid}) on request")
    assert 0 <= dumped_at < killed_at, every
    # no restart budget: the hang ends the job with the hang's exit code
    assert codes[agent_of[0]] == 10, every
    status = read_status(run0)
    # the job's end: failed by the hang, every rank exited (the one killed included)
    assert status["state"] == "failed", every
    assert [r["process_liveness"] for r in status["ranks"]] == ["exited"] * 4
    assert [r["node_rank"] for r in status["ranks"]] == [0, 0, 1, 1]
    assert no_leftover_workers(run_id)
