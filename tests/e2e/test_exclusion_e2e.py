"""Bad-node exclusion on loopback: several agents, one "node" (one agent's environment)
with a fake NVML whose GPU reports an XID error, or whose ranks keep crashing, or whose
GPU the rerun state machine finds faulty.

Why real launches: several agents on one rendezvous, the exit codes each agent ends
with, and the files a user (or the scheduler's retry) reads after the job. Three jobs:
an XID error and the rerun state machine excluding a node each while the others go on;
too few nodes left (the job ends with 15 and the host list); repeated crashes counted
against one node of two. The rules themselves (which GPU faults exclude, the restart count in
its window, who closes the rendezvous below MIN, the host list) are tested on the
components in ``tests/unit/launcher/test_exclusion.py``."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.factories import FAKE_PYNVML, load_fake_pynvml

from .conftest import (
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

HOST = socket.gethostname()


def fake_gpu_env(tmp_path: Path, name: str, **gpu: Any) -> dict[str, str]:
    """The environment of an agent whose one GPU NVML reports as ``gpu`` says."""
    fake = load_fake_pynvml()
    config = fake.write_config(tmp_path / f"{name}.nvml.json", [fake.make_gpu(0, **gpu)])
    path = os.pathsep.join([str(FAKE_PYNVML.parent), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "FAKE_NVML_CONFIG": str(config)}


def agent_cmd(
    port: int,
    run_id: str,
    log_dir: Path,
    nnodes: str,
    *sets: str,
    target: tuple[str, ...] = ("-m", "rankguard.demo.train", "--steps", "6"),
    last_call_s: int = 2,
) -> list[str]:
    extra: list[str] = []
    for item in sets:
        extra += ["--set", item]
    conf = f"last_call_timeout={last_call_s},join_timeout=60"
    run = node_run(None, port, run_id, log_dir, nproc=1, nnodes=nnodes, rdzv_conf=conf)
    return rankguard_cmd(*run, *extra, *target)


def run_dir(log_dir: Path, run_id: str) -> Path:
    return log_dir / "heartbeat" / run_id


def test_an_xid_error_and_the_rerun_state_machine_each_exclude_a_node_the_others_go_on(
    tmp_path: Path, run_id: str
) -> None:
    """Four agents, ``--nnodes 2:3``. Agent 3's GPU reports XID 79 (fallen off the bus):
    it is excluded before it joins any round, its ranks never start. The three others
    train; a NaN on global rank 2's first hardware only (exit 16, resume, the re-run
    differs: exit 17 naming rank 2) excludes rank 2's node; the two left resume from
    the checkpoint as a group of two and complete. ``--preload torch``: each node's
    ranks and their restarts are forked from its fork server (agent 3's, started before
    its GPU check, ends with it: nothing of the job is left)."""
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(4)}
    target = (
        # the ranks and their restarts forked from each node's fork server: their start
        # is not the subject (the repeated-crashes job starts its ranks afresh)
        "--preload",
        "torch",
        "--max-restarts",
        "2",
        "-m",
        "rankguard.demo.train",
        "--steps",
        "6",
        "--step-sleep",
        "0.01",
        "--fault",
        "nan-bad-gpu",
        "--fault-step",
        "3",
        "--fault-rank",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    )
    sets = (
        "fault_tolerance.exclude_bad_nodes=true",
        "rerun_state_machine.rerun_mode=validate_results",
    )
    envs = {a: fake_gpu_env(tmp_path, f"agent{a}") for a in range(3)}
    envs[3] = fake_gpu_env(tmp_path, "agent3", xid_events=[79])  # fallen off the bus
    # --nnodes 2:3: four agents, two excluded, two left (MIN 2) go on; a round of the
    # three healthy ones forms as soon as the third joins (MAX, no last call), the first
    # one up to 5 s after two joined, so that the three train together; the round of
    # the two left waits that last call
    cmds = {
        a: agent_cmd(port, run_id, logs[a], "2:3", *sets, target=target, last_call_s=5)
        for a in range(4)
    }
    outs, codes = run_nodes(cmds, timeout_s=140, envs=envs)
    every = "\n".join(f"--- agent {a} (exit {codes[a]})\n{o}" for a, o in outs.items())
    assert codes[3] == 15, every
    assert sorted(code if (code := codes[a]) is not None else -1 for a in range(3)) == [
        0,
        0,
        15,
    ], every
    (bad,) = [a for a in range(3) if codes[a] == 15]
    good = [a for a in range(3) if a != bad]

    # The agent excluded before the round: its finding and the host list, naming host,
    # GPU and XID.
    xid = run_dir(logs[3], run_id)
    (finding,) = [f for f in read_jsonl(xid / "findings.jsonl")]
    assert finding["finding_type"] == "node_excluded", every
    assert finding["reason"] == "node_gpu_failed_its_check_before_the_round"
    assert (finding["hostname"], finding["gpu_index"], finding["trigger"]) == (
        HOST,
        0,
        "gpu_health",
    )
    assert "xid=79" in finding["problems"]
    assert finding["slurm_exclude"] == f"--exclude={HOST}"
    excluded = json.loads((xid / "excluded_nodes.json").read_text())
    assert excluded["hosts"] == [HOST] and excluded["below_min_nodes"] is False
    assert excluded["kubectl"] == [
        f"kubectl taint nodes {HOST} rankguard.io/excluded=true:NoSchedule"
    ]
    # its own exclusion first (the agent that hosts the rendezvous store stays up for
    # the others and may note the later one too)
    node = excluded["nodes"][0]
    assert node["trigger"] == "gpu_health" and "xid=79" in node["problems"], excluded
    assert node["gpu"] == 0 and node["node_rank"] is None  # before it joined any round
    assert not heartbeat_files(xid)  # its ranks never started
    assert "excluded" in outs[3] and "xid=79" in outs[3]

    # The node the rerun state machine found faulty.
    excluded_rerun = [
        f
        for f in read_jsonl(run_dir(logs[bad], run_id) / "findings.jsonl")
        if f["finding_type"] == "node_excluded"
    ]
    assert [(f["trigger"], f["reason"]) for f in excluded_rerun] == [
        ("rerun", "node_gpu_found_faulty_by_the_rerun_state_machine")
    ], every
    assert excluded_rerun[0]["hostname"] == HOST
    assert "rank 2: GPU cpu" in excluded_rerun[0]["problems"]

    # The two others went on as a group of two and completed.
    assert "[demo] done: 6 steps on 2 rank(s)" in "".join(outs[a] for a in good), every
    run0 = next(
        run_dir(logs[a], run_id)
        for a in good
        if (run_dir(logs[a], run_id) / "launcher_node_0.json").exists()
    )
    # Node 0's monitor: the excluded node's rank retired when the group re-formed; the
    # run completed with the two ranks left. It noted both exclusions, in order; the
    # rerun findings name rank 2.
    status = read_status(run0)
    assert status["state"] == "completed", every
    assert [r["rank"] for r in status["ranks"]] == [0, 1], every
    found = read_jsonl(run0 / "findings.jsonl")
    assert [f["trigger"] for f in found if f["finding_type"] == "node_excluded"] == [
        "gpu_health",
        "rerun",
    ], every
    assert {(f["finding_type"], f["rank"]) for f in found if "rerun" in f["finding_type"]} == {
        ("rerun_persistent_fault", 2),
        ("rerun_validation_failed", 2),
    }, every
    for a in good:
        listed = json.loads((run_dir(logs[a], run_id) / "excluded_nodes.json").read_text())
        assert listed["hosts"] == [HOST] and listed["below_min_nodes"] is False, every
        assert [n["trigger"] for n in listed["nodes"]] == ["gpu_health", "rerun"], every
    assert no_leftover_workers(run_id)


def test_below_min_nodes_the_job_ends_with_15_and_the_host_list(
    tmp_path: Path, run_id: str
) -> None:
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(2)}
    envs = {
        0: fake_gpu_env(tmp_path, "agent0"),
        1: fake_gpu_env(tmp_path, "agent1", ecc_uncorrected=2),
    }
    cmds = {
        a: agent_cmd(port, run_id, logs[a], "2", "fault_tolerance.exclude_bad_nodes=true")
        for a in range(2)
    }
    outs, codes = run_nodes(cmds, timeout_s=100, envs=envs)
    every = "\n".join(f"--- agent {a} (exit {codes[a]})\n{o}" for a, o in outs.items())
    assert codes == {0: 15, 1: 15}, every
    for a in (0, 1):
        excluded = json.loads((run_dir(logs[a], run_id) / "excluded_nodes.json").read_text())
        assert excluded["hosts"] == [HOST] and excluded["below_min_nodes"] is True, every
        assert excluded["slurm_exclude"] == f"--exclude={HOST}"
        (node,) = excluded["nodes"]
        assert node["trigger"] == "gpu_health" and "ecc_uncorrected_volatile=2" in node["problems"]
        assert not heartbeat_files(run_dir(logs[a], run_id))
    found = read_jsonl(run_dir(logs[0], run_id) / "findings.jsonl")
    assert [f["reason"] for f in found] == ["nodes_left_after_exclusion_below_min_nodes"], every
    assert "--exclude=" in outs[0] and "kubectl taint nodes" in outs[0]
    # no round ever formed: the store's host waits neither for a node 0 monitor that
    # never ran nor for its own entry as a spare (it used to wait 60 s, then 17 s)
    assert "keeping the rendezvous store" not in every, every
    assert "spares still waiting" not in every, every
    assert no_leftover_workers(run_id)


def test_repeated_crashes_on_one_node_exclude_it_after_k(tmp_path: Path, run_id: str) -> None:
    """Two agents, ``--nnodes 1:2``: agent 1's rank crashes at step 3 in every attempt;
    its node is counted as the cause of each restart (not its peer, whose collective
    broke with it), excluded at the second, and the node left trains on alone and
    completes. Two agents suffice: the crashed node against the peer it broke is what
    the count decides; the others going on as a group of several is the XID job's
    (three agents there). ``--preload torch.distributed``: each node's ranks are forked
    from its fork server (several agents' ranks started afresh, a restart among them:
    the first two jobs of ``test_spares_e2e``)."""
    port = free_port()
    logs = {a: tmp_path / f"agent{a}" for a in range(2)}
    script = str(Path(__file__).parent / "scripts" / "crash_here.py")
    cmds = {}
    for a in range(2):
        cmd = agent_cmd(
            port,
            run_id,
            logs[a],
            "1:2",
            "fault_tolerance.exclude_after_restarts=2",
            "fault_tolerance.exclude_window_s=600",
            # the ranks and their restarts (five in all) forked from each node's fork
            # server, which imports torch without torch._dynamo (the script builds no
            # optimizer): what is counted is which node's rank crashed, not how it started
            target=(
                "--max-restarts",
                "3",
                "--preload",
                "torch.distributed",
                script,
                "--steps",
                "10",
            ),
            # MIN 1: the first round waits up to 5 s for the second agent (two agents
            # started together reach the rendezvous seconds apart on a loaded machine);
            # a round of both forms at once (MAX)
            last_call_s=5,
        )
        cmds[a] = cmd
    outs, codes = run_nodes(cmds, timeout_s=130, envs={1: {"CRASH_HERE": "1"}})
    every = "\n".join(f"--- agent {a} (exit {codes[a]})\n{o}" for a, o in outs.items())
    assert codes == {0: 0, 1: 15}, every
    bad = run_dir(logs[1], run_id)
    (finding,) = [
        f for f in read_jsonl(bad / "findings.jsonl") if f["finding_type"] == "node_excluded"
    ]
    assert finding["reason"] == "node_ranks_caused_too_many_restarts_in_the_window", every
    assert finding["trigger"] == "restarts" and "restarts=2" in finding["problems"]
    assert finding["hostname"] == HOST and finding["node_rank"] is not None
    assert json.loads((bad / "excluded_nodes.json").read_text())["hosts"] == [HOST]
    assert "crash_here done: 10 steps, world 1" in outs[0], every
    # Node 0's monitor (agent 0's, the node left): the excluded node's rank retired when
    # the group re-formed; the run completed with the one rank left.
    run0 = run_dir(logs[0], run_id)
    assert (run0 / "launcher_node_0.json").exists(), every
    status = read_status(run0)
    assert status["state"] == "completed", every
    assert [r["rank"] for r in status["ranks"]] == [0], every
    # what node 0 reported: the two crashes of the bad node's rank and its exclusion
    found = [(f["finding_type"], f["node_rank"]) for f in read_jsonl(run0 / "findings.jsonl")]
    bad_node = finding["node_rank"]
    assert found == [("rank_process_exited", bad_node)] * 2 + [("node_excluded", bad_node)], every
    assert no_leftover_workers(run_id)
