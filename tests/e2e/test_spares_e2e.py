"""Losing a node on loopback: agents of one job (``--nnodes MIN:MAX``), each its own log
dir, one agent and its workers SIGKILLed mid-run. Three jobs: a healthy run with spares
waiting (no finding, no restart; one killed while it waits is listed gone), then its
node 1 lost (a spare takes its place, training resumes from the newest checkpoint, the
lost rank is the one finding; the spare not needed leaves at the end); node 0 lost (the
new round's node 0 runs the monitor, the spare takes node 1); a job without a spare
that shrinks, then grows back when a node comes.

Why real launches: several agents on one rendezvous, each in its own process group
(agent and workers lost together), and the files and output a user reads after the
job. The first two jobs' ranks start afresh (a new interpreter each, the spares' too);
the shrinking job forks its first two agents' ranks from their ``--preload torch`` fork
servers, where the survivor's rank starts three times. What each part decides alone (the spare
entries, the shrink and grow decisions, the keep-alive and the store's wait for spares)
is tested in ``tests/unit/launcher/test_spares.py``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from rankguard.launcher.spares import waiting_agents

from .conftest import (
    free_port,
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    run_rankguard,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

# a lost node noticed in 3 s (1 s keep-alives, 3 missed); a shrunk round 1 s after MIN
RDZV_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1"
NO_HOST = f"{RDZV_CONF},is_host=false"  # every agent a client of the store
# MIN:MAX jobs: a first round that waits 5 s for its second node (two agents started
# together on a loaded machine reach the rendezvous seconds apart: with a 1 s last call
# the first round could start with one node and grow), a shrunk round 5 s after a loss
SHRINK_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=5,is_host=false"


def host_store(port: int) -> TCPStore:
    """The rendezvous store hosted by this test: a host that does not train."""
    return TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)


HEALTHY_STEPS = 40  # the healthy job with spares, then its node 1 lost

FAST = [
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=60",
    "heartbeat.process_timeout_s=5",
    "heartbeat.initial_progress_timeout_s=60",
    "heartbeat.progress_timeout_s=8",
]


def agent_cmd(
    i: int,
    nnodes: str,
    port: int,
    run_id: str,
    tmp: Path,
    steps: int,
    conf: str = RDZV_CONF,
    *demo: str,
    preload: bool = False,
) -> list[str]:
    """``preload``: the agent's ranks (and their restarts) forked from its
    ``--preload torch`` fork server, which starts with the agent."""
    sets: list[str] = []
    for item in FAST:
        sets += ["--set", item]
    if preload:
        sets += ["--preload", "torch"]
    return rankguard_cmd(
        "run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        conf,
        "--max-restarts",
        "2",
        "--log-dir",
        str(tmp / f"agent{i}"),
        *sets,
        "-m",
        "rankguard.demo.train",
        "--steps",
        str(steps),
        "--step-sleep",
        "0.1",
        "--log-every",
        "1",
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--checkpoint-every",
        "5",
        *demo,
    )


class Agents:
    """Agents started one after the other, each in its own session (a kill of the
    session is the loss of that node: agent and workers)."""

    def __init__(
        self, cmds: list[list[str]], tmp: Path, *, spares: int = 0, host_port: int = 0
    ) -> None:
        """The last ``spares`` agents start once the others trained: torch numbers the
        nodes of a round by host and pid, so a spare (the highest pid) takes the last
        node's number in the next round. ``host_port``: the others start once the first
        listens on it (the first hosts the rendezvous store)."""
        self.tmp = tmp
        self.logs: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for k, cmd in enumerate(cmds[: len(cmds) - spares]):
            self.start(cmd)
            if k == 0 and host_port:
                self.listening(host_port, 60)
        if spares:
            for k in range(len(cmds) - spares):
                self.node(k)
            for cmd in cmds[len(cmds) - spares :]:
                self.start(cmd)

    def start(self, cmd: list[str]) -> None:
        log = self.tmp / f"agent{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "w", encoding="utf-8") as out:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )
        time.sleep(0.2)

    def listening(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                assert time.monotonic() < deadline, self.all_text()
                time.sleep(0.1)

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: object) -> None:
        """Every agent still running is killed with its workers (a failed test)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    def text(self, i: int) -> str:
        return self.logs[i].read_text(encoding="utf-8", errors="replace")

    def all_text(self) -> str:
        return "\n".join(f"--- agent {i}\n{self.text(i)}" for i in range(len(self.logs)))

    def wait_for(self, pattern: str, timeout_s: float) -> int:
        """The agent whose output first matches ``pattern``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i in range(len(self.logs)):
                if re.search(pattern, self.text(i)):
                    return i
            time.sleep(0.1)
        raise AssertionError(f"no agent printed {pattern!r}\n{self.all_text()}")

    def node(self, k: int, timeout_s: float = 60) -> int:
        return self.wait_for(rf"rank\(s\) on node {k} ", timeout_s)

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(timeout=10)

    def finish(self, timeout_s: float) -> dict[int, int | None]:
        deadline = time.monotonic() + timeout_s
        codes: dict[int, int | None] = {}
        for i, proc in enumerate(self.procs):
            try:
                codes[i] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[i] = None
        return codes


def demo_steps(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"\[demo\] step (\d+)/", text)]


def status_of(tmp: Path, i: int, run_id: str) -> dict[str, Any]:
    return read_status(tmp / f"agent{i}" / "heartbeat" / run_id)


def test_spares_wait_without_a_finding_a_killed_one_is_gone_one_takes_the_lost_nodes_place(
    tmp_path: Path, run_id: str
) -> None:
    """Two spares wait beside a healthy two-node job: nothing found, nothing restarted;
    one spare killed while it waits is listed gone. Then node 1 is lost: the other spare
    takes its place, training resumes from the newest checkpoint on two ranks, the lost
    rank is the one finding. A third spare, started once the new round formed (two
    spares waiting at the loss could both take the places, the surviving node left to
    wait), is not needed and leaves at the end; the store's host (node 0) does not wait
    for the killed one."""
    port = free_port()
    # 40 steps of at least 0.3 s (12 s, mostly asleep: little CPU on a loaded machine): a
    # spare killed while it waits is found gone after 3 missed keep-alives (1 s here) and
    # node 0's reading period (2 s), before node 1 is lost (at step 8 or later, after
    # the checkpoint of step 5), and the third spare waits before the end
    cmds = [
        agent_cmd(i, "2:2", port, run_id, tmp_path, HEALTHY_STEPS, RDZV_CONF, "--step-sleep", "0.3")
        for i in range(5)
    ]
    host = f"{socket.gethostname()}"
    agent = {i: "" for i in range(5)}
    with Agents(cmds[:4], tmp_path, spares=2, host_port=port) as agents:
        node0, node1, spare = agents.node(0), agents.node(1), 2
        # agent 0 hosts the store (it bound the port first) and, the lowest pid, is
        # node 0: node 1 can be lost without the store
        assert (node0, node1) == (0, 1), agents.all_text()
        agent.update({i: f"{host}:{p.pid}" for i, p in enumerate(agents.procs)})
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        deadline = time.monotonic() + 60
        while waiting_agents(client, run_id) < 2:  # both spares in the rendezvous
            assert time.monotonic() < deadline, agents.all_text()
            time.sleep(0.2)
        agents.kill(3)  # a spare lost while it waits: no agent left to say so
        run0 = tmp_path / f"agent{node0}" / "heartbeat" / run_id
        deadline = time.monotonic() + 30  # node 0's monitor lists it gone
        while (status := read_status(run0))["elastic"]["spares_gone"] != [agent[3]]:
            assert time.monotonic() < deadline, status["elastic"]
            time.sleep(0.2)
        # the healthy job with spares waiting: no finding, no restart
        assert status["summary"]["findings_total"] == 0, status["summary"]
        assert not status.get("restarts"), status.get("restarts")
        waiting = [s["agent"] for s in status["elastic"]["spares_waiting"]]
        assert waiting == [agent[spare]], status["elastic"]
        findings = run0 / "findings.jsonl"
        assert not findings.exists() or read_jsonl(findings) == [], agents.all_text()
        assert "restart 1 of the workers" not in agents.text(node0), agents.all_text()
        agents.wait_for(r"\[demo\] step 8/", 90)
        agents.kill(node1)
        deadline = time.monotonic() + 60  # the spare took node 1's place
        while "rank(s) on node 1" not in agents.text(spare):
            assert time.monotonic() < deadline, agents.all_text()
            time.sleep(0.2)
        agents.start(cmds[4])  # the third spare: it waits until the end
        agent[4] = f"{host}:{agents.procs[4].pid}"
        deadline = time.monotonic() + 60  # node 0's monitor lists it waiting
        while [s["agent"] for s in read_status(run0)["elastic"]["spares_waiting"]] != [agent[4]]:
            assert time.monotonic() < deadline, agents.all_text()
            time.sleep(0.2)
        codes = agents.finish(110)
    out = agents.all_text()
    assert (codes[node0], codes[spare], codes[4]) == (0, 0, 0), out
    text0 = agents.text(node0)
    # the new round took the spare: two ranks again, from the newest checkpoint (step
    # 5 or later: saved every 5, the node was lost after step 8), not from step 0
    match = re.search(r"\[demo\] resumed from step (\d+)", text0)
    assert match is not None, out
    saved = int(match.group(1))
    assert saved >= 5, out
    steps = demo_steps(text0)
    after = demo_steps(text0[text0.index(match.group(0)) :])
    assert after[0] == saved + 1 and after[-1] == HEALTHY_STEPS, out
    assert steps.count(1) == 1, out  # never from the start again
    assert f"[demo] done: {HEALTHY_STEPS} steps on 2 rank(s)" in text0, out
    # node 0 stayed node 0: the new round says which agent did not come back, whether
    # or not rank 1's heartbeats had been silent long enough to name it at the restart
    assert "node 1 of the previous round" in text0 and "did not come back" in text0, out
    # the spare not needed leaves when the job ends; the store's host did not wait for
    # the killed spare to leave
    assert "waited as a spare: it was not needed" in agents.text(4), out
    assert "spares still waiting in the rendezvous" not in out, out

    status = read_status(run0)
    assert status["state"] == "completed", json.dumps(status)[:2000]
    elastic = status["elastic"]
    assert (elastic["nodes"], elastic["shrunk"]) == (2, False), elastic
    [replaced] = elastic["replacements"]
    assert (replaced["node"], replaced["spare"]) == (1, agent[spare]), elastic
    assert replaced["replaced"] == agent[node1], elastic
    assert [s["agent"] for s in elastic["spares_waiting"]] == [agent[4]], elastic
    assert elastic["spares_gone"] == [agent[3]], elastic
    # the lost node's rank is named, nothing else
    found = read_jsonl(run0 / "findings.jsonl")
    assert [f["rank"] for f in found] == [1], found
    shown = run_rankguard(["status", str(run0)], timeout=60)
    assert "Nodes: 2 of 2:2, 1 spare(s) waiting" in shown.stdout, shown.stdout + shown.stderr
    assert f"gone     {agent[3]}" in shown.stdout, shown.stdout
    assert no_leftover_workers(run_id)


def test_node0_lost_a_spare_takes_its_place_and_the_new_rounds_node0_runs_the_monitor(
    tmp_path: Path, run_id: str
) -> None:
    """Node 0 (the monitor's node) lost while a spare waits: node 1 is renumbered 0 and
    runs the monitor, the spare takes node 1, training resumes from the newest
    checkpoint on two ranks again and completes."""
    port = free_port()
    store = host_store(port)  # the store on a host that does not train: node 0 may go
    cmds = [agent_cmd(i, "2:2", port, run_id, tmp_path, 20, NO_HOST) for i in range(3)]
    with Agents(cmds, tmp_path, spares=1) as agents:
        node0, node1, spare = agents.node(0), agents.node(1), 2
        agents.wait_for(r"\[demo\] step 8/", 90)
        agents.kill(node0)
        codes = agents.finish(110)
    del store
    out = agents.all_text()
    assert codes[node1] == 0 and codes[spare] == 0, out
    pid = {i: f"{socket.gethostname()}:{agents.procs[i].pid}" for i in range(3)}
    text1 = agents.text(node1)
    assert "renumbered this node 1 -> 0" in text1 and "the job monitor runs here now" in text1
    assert "rank(s) on node 1" in agents.text(spare), out
    # the new round took the spare: two ranks again, from the newest checkpoint (saved
    # every 5, node 0 was lost after step 8), not from step 0; rank 0 prints the steps:
    # node 0's from step 1 until it was lost, node 1's (rank 0 once renumbered) from
    # the checkpoint on
    match = re.search(r"\[demo\] resumed from step (\d+)", text1)
    assert match is not None, out
    saved = int(match.group(1))
    assert saved >= 5, out
    after = demo_steps(text1[text1.index(match.group(0)) :])
    assert after[0] == saved + 1 and after[-1] == 20, out
    assert demo_steps(agents.text(node0))[:8] == list(range(1, 9)), out
    assert demo_steps(text1) == after, out
    assert "[demo] done: 20 steps on 2 rank(s)" in text1, out

    status = status_of(tmp_path, node1, run_id)
    assert status["state"] == "completed", json.dumps(status)[:2000]
    elastic = status["elastic"]
    assert (elastic["nodes"], elastic["shrunk"]) == (2, False), elastic
    assert [m["node"] for m in elastic["members"]] == [0, 1], elastic
    [replaced] = elastic["replacements"]
    assert (replaced["spare"], replaced["replaced"]) == (pid[spare], pid[node0]), elastic
    assert elastic["lost"] == [pid[node0]], elastic
    # the lost node's rank is named, not the survivor whose collective broke with it
    # (that monitor never saw node 0's ranks: the previous round's agents tell it)
    found = read_jsonl(tmp_path / f"agent{node1}" / "heartbeat" / run_id / "findings.jsonl")
    assert [f["rank"] for f in found] == [0], found
    assert found[0]["node_rank"] == 0 and pid[node0] in found[0]["message"], found
    assert "its agent left the rendezvous" in found[0]["message"], found
    assert f"node 0 of the previous round (agent {pid[node0]}) did not come back" in text1
    assert no_leftover_workers(run_id)


def test_without_a_spare_the_job_shrinks_then_grows_back_when_a_node_comes(
    tmp_path: Path, run_id: str
) -> None:
    """Node 1 lost without a spare: the next round has the one node left (the global
    batch kept: two micro-batches per step), resumed from the newest checkpoint, the
    perf figures for one GPU; a third agent comes: the job grows back to two nodes at
    its next round, the restart that took it in named."""
    port = free_port()
    # The store on a host that does not train (this test): the node lost is whichever
    # the rendezvous numbered 1, and the store's host is the one node whose loss would
    # end the job (which agent binds the port first is a race).
    store = host_store(port)
    # the global batch of 16 samples: one micro-batch of 8 per rank on 2 ranks, two on 1
    # the first two agents' ranks forked from their fork servers: the survivor starts its
    # rank three times (the first round, the shrunk one, the grown one); the newcomer
    # starts its one rank afresh: a fork server importing beside its launcher would delay
    # its arrival, and the shrunk job may have trained its last step by then
    cmds = [
        agent_cmd(
            i, "1:2", port, run_id, tmp_path, 40, SHRINK_CONF, "--global-batch", "16", preload=i < 2
        )
        for i in range(3)
    ]
    with Agents(cmds[:2], tmp_path) as agents:
        node0, node1 = agents.node(0), agents.node(1)
        agents.wait_for(r"\[demo\] step 8/", 90)
        agents.kill(node1)
        agents.wait_for(r"batch plan: 1 rank\(s\)", 60)  # shrunk, training again
        shrunk_at = len(agents.text(node0))
        # the shrunk job trains on: a step after the resume, then its status says so
        agents.wait_for(r"\[demo\] resumed from step \d+", 30)
        resumed = re.search(r"\[demo\] resumed from step (\d+)", agents.text(node0)[shrunk_at:])
        assert resumed is not None, agents.all_text()
        saved = int(resumed.group(1))
        deadline = time.monotonic() + 30
        while f"[demo] step {saved + 2}/" not in agents.text(node0)[shrunk_at:]:
            assert time.monotonic() < deadline, agents.all_text()
            time.sleep(0.1)
        deadline = time.monotonic() + 10  # the monitor's next status (every 0.5 s)
        while (elastic := status_of(tmp_path, node0, run_id)["elastic"])["nodes"] != 1:
            assert time.monotonic() < deadline, elastic
            time.sleep(0.2)
        assert (elastic["shrunk"], elastic["replacements"]) == (True, []), elastic
        agents.start(cmds[2])  # a node comes: the job takes it at its next round
        codes = agents.finish(120)
    del store
    out = agents.all_text()
    assert codes[node0] == 0 and codes[2] == 0, out
    text0 = agents.text(node0)
    assert "this round has 1 of 2 node(s) (--nnodes 1:2)" in text0, out
    assert saved >= 5, out
    shrunk = text0[text0.index(f"[demo] resumed from step {saved}") :]
    assert demo_steps(shrunk)[0] == saved + 1, out
    assert "this round has 2 of 2 node(s) again (it had 1): the job grows back to 2" in text0
    # The grown round's numbers are the rendezvous's: torch's c10d sorts the nodes (host,
    # then the agent's pid), so on one host the newcomer is node 0 when its pid is the
    # lower one (pids wrap at pid_max): the survivor then says it was renumbered, and the
    # newcomer's node runs rank 0 (the demo's lines) and node 0's services from there on.
    renumbered = "the rendezvous renumbered this node 0 -> 1" in text0
    last0 = 2 if renumbered else node0  # the agent that is node 0 at the end
    assert f"rank(s) on node {0 if renumbered else 1}" in agents.text(2), out
    plans = re.findall(r"\[demo\] batch plan: (.*)", text0)
    if renumbered:
        plans += re.findall(r"\[demo\] batch plan: (.*)", agents.text(2))
    assert plans == [
        "2 rank(s), 1 micro-batch(es) of 8 per step, global batch 16 (keep_global)",
        "1 rank(s), 2 micro-batch(es) of 8 per step, global batch 16 (keep_global)",
        "2 rank(s), 1 micro-batch(es) of 8 per step, global batch 16 (keep_global)",
    ], plans
    assert "[demo] done: 40 steps on 2 rank(s)" in agents.text(last0), out
    # the restart that took the node in is named, not an unknown cause
    run0 = tmp_path / f"agent{node0}" / "heartbeat" / run_id
    restarts = read_jsonl(run0 / "restarts.jsonl")
    assert [r["cause"] for r in restarts] == ["worker_failed", "nodes_joined"], restarts
    # the survivor's rank failed in its broken collective: said so, not made the culprit
    assert restarts[0]["reason"] == "peer_failure", restarts
    assert restarts[0]["message"].startswith("its peer went away ("), restarts
    assert restarts[1]["rank"] is None, restarts
    assert "node(s) waiting to join" in restarts[1]["message"], restarts
    assert "restart 2 of the workers: nodes_joined" in text0, out
    elastic = status_of(tmp_path, last0, run_id)["elastic"]
    assert (elastic["nodes"], elastic["shrunk"]) == (2, False), elastic
    assert len(elastic["members"]) == 2, elastic

    # the perf monitor's figures follow the world size: the job's total is two GPUs'
    # worth before the loss, one while shrunk, two again after it grew back
    def perf_of(i: int) -> list[dict[str, Any]]:
        return read_jsonl(tmp_path / f"agent{i}" / "perf_monitor" / run_id / "perf.jsonl")

    perf = perf_of(node0)
    first, last = perf[0], perf_of(last0)[-1]
    assert first["TFLOPS_total"] == pytest.approx(2 * first["TFLOPS_per_GPU"], rel=0.01), first
    assert any(
        p["TFLOPS_per_GPU"] and p["TFLOPS_total"] == pytest.approx(p["TFLOPS_per_GPU"], rel=0.01)
        for p in perf
    ), perf
    assert last["TFLOPS_total"] == pytest.approx(2 * last["TFLOPS_per_GPU"], rel=0.01), last
    assert no_leftover_workers(run_id)
