"""End to end: a lost node's rank taken over by another node's standby. Two agents of
one job on loopback (each its own log dir, the rendezvous store hosted by the test), one
training rank and one standby each; node 1's agent and workers SIGKILLed mid-run: node
0's standby takes rank 1 (its own ``LOCAL_RANK``), rank 0 keeps its pid, no group
restart, the job ends with the losses of an uninterrupted run, and node 0 writes the
recovery's ``restarts.jsonl`` line and the finding naming rank 1. Each node's rank and
standby are forked from its ``--preload torch`` fork server (the node's one torch import).

Why a real launch: only two agents on one rendezvous, each node's workers and the lost
node's agent gone with them, show that node 0 decides from the lost launcher's silence
and the survivors' wait, and that torch elastic's exit barrier does not hold the
survivor for the lost agent. The decision, the claims, the assignment and the
bookkeeping alone are tested in ``tests/unit/live/test_nodes.py`` and
``tests/unit/launcher/test_live_nodes.py``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from tests.factories import start_module_ranks

from .conftest import (
    fast_sets,
    free_port,
    heartbeat_files,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

STEPS = 20
KILL_AFTER = 6  # node 1 is lost once rank 0 printed this step
DEMO = ["-m", "rankguard.demo.train", "--steps", str(STEPS), "--log-every", "1"]
LIVE = [
    "--standby-ranks",
    "1",
    "--set",
    "inprocess_restart.enabled=true",
    "--set",
    "inprocess_restart.soft_timeout=3",
    "--set",
    "inprocess_restart.process_group_timeout=2",
    "--set",
    "inprocess_restart.heartbeat_interval=0.2",
    "--set",
    "inprocess_restart.heartbeat_timeout=4",
]
# the loss as the demo prints it (``.4f``): an unbuffered ``print`` writes the line and
# its newline apart, and another process's line may come between the two
_LOSS = re.compile(r"\[demo\] step (\d+)/\d+ loss (-?(?:\d+\.\d{4}|nan|inf))")


def _agent(node: int, port: int, run_id: str, tmp: Path) -> list[str]:
    return rankguard_cmd(
        "run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        "is_host=false",  # the store is the test's: node 1's loss does not take it
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp / f"agent{node}"),
        *fast_sets(),
        *LIVE,
        # each node's rank and standby forked from its fork server: two agents start two
        # ranks each, and how a rank starts is not the subject (the second live-recovery
        # launch of test_live_recovery_e2e starts its ranks and standby afresh)
        "--preload",
        "torch",
        *DEMO,
        "--step-sleep",
        "0.1",
    )


def _losses(text: str) -> dict[int, str]:
    return {int(step): loss for step, loss in _LOSS.findall(text)}


def _text(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")


def test_a_lost_nodes_rank_is_taken_over_by_the_other_nodes_standby(
    tmp_path: Path, run_id: str
) -> None:
    # the uninterrupted run, beside the job (its losses are read at the end): the demo's
    # two ranks without a launcher, forked from the rank tests' fork server (what is
    # compared is the demo's arithmetic, not a launch: no launcher, fork server and
    # monitor of its own)
    (tmp_path / "ref").mkdir()
    ref = start_module_ranks(DEMO[1], DEMO[2:], 2, tmp_path / "ref")
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, log in enumerate(logs):
            with open(log, "w", encoding="utf-8") as out:
                procs.append(
                    subprocess.Popen(
                        _agent(i, port, run_id, tmp_path),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # a kill of the session: the node lost
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    )
                )
        deadline = time.monotonic() + 90
        node1 = None
        while node1 is None:
            texts = [_text(log) for log in logs]
            assert time.monotonic() < deadline, "\n".join(texts)
            # node 0 prints rank 0's losses; the other agent is node 1
            for i, text in enumerate(texts):
                if f"[demo] step {KILL_AFTER}/" in text:
                    node1 = 1 - i
            time.sleep(0.05)
        node0 = 1 - node1
        os.killpg(procs[node1].pid, signal.SIGKILL)
        procs[node1].wait(timeout=10)
        code = procs[node0].wait(timeout=90)
        for rank in ref:
            rank.join(60)
        ref_codes = [rank.exitcode for rank in ref]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for rank in ref:
            if rank.exitcode is None:
                rank.kill()
                rank.join(10)
        del store
    ref_out = _text(tmp_path / "ref" / "rank_0.out")  # rank 0 prints the losses
    assert ref_codes == [0, 0], ref_out[-6000:] + _text(tmp_path / "ref" / "rank_1.out")[-3000:]
    reference = _losses(ref_out)
    assert len(reference) == STEPS
    out = _text(logs[node0])
    assert code == 0, out[-6000:]
    assert re.search(r"live recovery: node 1 lost .*no group restart", out), out[-6000:]
    assert "restart 1 of the workers" not in out, out[-6000:]
    run_dir = tmp_path / f"agent{node0}" / "heartbeat" / run_id
    (line,) = read_jsonl(run_dir / "restarts.jsonl")
    assert (line["kind"], line["lost_rank"], line["node"], line["lost_node"]) == (
        "live_recovery",
        1,
        0,
        1,
    )
    assert line["resumed_t"] is not None and line["steps_redone"] <= 1
    # the fault is the lost launcher's last sign of life: finding the node lost counts
    assert line["recovery_s"] > 1.0, line
    # rank 0 kept its pid (one process before and after the loss); node 0's standby
    # became rank 1 and trained only after it took over
    by_pid = {recs[0]["pid"]: recs for recs in map(read_jsonl, heartbeat_files(run_dir))}
    steps = {pid: {r.get("iteration") or 0 for r in recs} - {0} for pid, recs in by_pid.items()}
    (survivor,) = [pid for pid, recs in by_pid.items() if recs[0]["rank"] == 0]
    assert min(steps[survivor]) <= KILL_AFTER < max(steps[survivor]), sorted(steps[survivor])
    newcomer = by_pid[line["standby_pid"]]
    assert newcomer[0]["rank"] == 1 and newcomer[0]["node_rank"] == 0, newcomer[0]
    assert min(steps[line["standby_pid"]]) >= KILL_AFTER
    # the losses of the uninterrupted run, every step
    assert _losses(out) == reference, out[-6000:]
    live = read_status(run_dir)["live"]
    assert live["used"] == 1 and live["replaced"][0]["lost_rank"] == 1, live
    findings = read_jsonl(run_dir / "findings.jsonl")
    lost = [f for f in findings if f.get("rank") == 1 and f.get("pid") == line["lost_pid"]]
    assert lost and lost[0]["finding_type"] == "rank_process_exited", findings
    assert no_leftover_workers(run_id)
