"""Signals only to this node's own workers: the registry (pid and start time), the kill
path refusing any other pid, and node 0's handler refusing a forged record's pid."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft import kill as kill_mod
from rankguard.ft.actions import FaultHandler
from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.kill import (
    NOT_A_WORKER,
    DumpPolicy,
    KillTarget,
    OwnedWorkers,
    dump_stacks_of,
    dump_then_kill,
    kill_marked,
)
from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.util.procs import process_start_time
from tests.factories import Children, alive, heartbeat_config, heartbeat_record

RUN = "run-owned"
HOST = socket.gethostname()
# No dump handler: a dump signal (a real-time signal) would end it, so it stays alive
# only if nothing at all is sent to it.
POLICY = DumpPolicy(method="faulthandler", timeout_s=2.0)


def test_start_time_is_field_22_of_proc_stat() -> None:
    with open(f"/proc/{os.getpid()}/stat", encoding="ascii", errors="replace") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    assert process_start_time(os.getpid()) == int(fields[19])
    assert process_start_time(0) is None
    assert process_start_time(-1) is None


# ---- the registry --------------------------------------------------------------------


def test_registry_owns_only_its_current_workers(children: Children) -> None:
    worker, other = children.start(), children.start()
    workers = OwnedWorkers()
    assert not workers.owns(worker.pid)  # nothing started yet
    workers.set([worker.pid, 1, 0, -1])
    assert workers.owns(worker.pid)
    assert not workers.owns(other.pid)
    assert not any(workers.owns(pid) for pid in (1, 0, -1, os.getpid()))
    assert list(workers.pids()) == [worker.pid]  # pids <= 1 are never registered
    workers.clear()  # the group stopped
    assert not workers.owns(worker.pid)


def test_registry_refuses_a_reused_pid(children: Children, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    started = workers.pids()[worker.pid]
    assert started is not None
    # the same pid, another process: another start time
    monkeypatch.setattr(kill_mod, "process_start_time", lambda pid: started + 1)
    assert not workers.owns(worker.pid)
    assert kill_marked([KillTarget(rank=0, pid=worker.pid, kill=True)], owner=workers) == []
    assert alive(worker)


def test_registry_forgets_a_worker_that_exited(children: Children) -> None:
    worker = children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    worker.kill()
    worker.wait(timeout=10)
    assert not workers.owns(worker.pid)


# ---- the kill path -------------------------------------------------------------------


def test_kill_refuses_a_pid_that_is_not_a_worker(tmp_path: Path, children: Children) -> None:
    worker, stranger = children.start(), children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    targets = [
        KillTarget(rank=0, pid=stranger.pid, kill=True),
        KillTarget(rank=1, pid=-1, kill=True),
        KillTarget(rank=2, pid=0, kill=True),
    ]
    done = dump_then_kill(tmp_path, targets, POLICY, owner=workers)
    assert done.killed == []
    assert [(r.rank, r.pid) for r in done.refused] == [(0, stranger.pid), (1, -1), (2, 0)]
    assert done.refused[0].reason == NOT_A_WORKER
    assert all(d.path is None for d in done.dumps)  # not even a dump signal
    assert dict((d.rank, d.error) for d in done.dumps)[0] == NOT_A_WORKER
    assert alive(stranger) and alive(worker)
    assert not (tmp_path / "stacks").exists()


def test_kill_reaches_a_worker_and_only_it(tmp_path: Path, children: Children) -> None:
    worker, stranger = children.start(), children.start()
    workers = OwnedWorkers()
    workers.set([worker.pid])
    targets = [KillTarget(0, worker.pid, kill=True), KillTarget(1, stranger.pid, kill=True)]
    assert kill_marked(targets, owner=workers) == [worker.pid]
    assert worker.wait(timeout=5) == -9
    assert alive(stranger)
    dumps = dump_stacks_of(tmp_path, [KillTarget(1, stranger.pid)], POLICY, owner=workers)
    assert [d.error for d in dumps] == [NOT_A_WORKER]


# ---- node 0's handler ----------------------------------------------------------------


class FakeMonitor:
    def __init__(self, rules: HeartbeatRules) -> None:
        self.rules = rules

    def note_restart(self, reason: str) -> None:
        self.rules.note_restart(reason)


class FakeAgent:
    def __init__(self) -> None:
        self.causes: list[tuple[dict[str, Any], bool]] = []

    def set_cause(self, finding: dict[str, Any], *, abort: bool) -> None:
        self.causes.append((finding, abort))

    def withdraw_cause(self, finding: dict[str, Any]) -> None:
        self.causes = [(f, a) for f, a in self.causes if f is not finding]


def test_node0_refuses_the_pid_of_a_forged_record(tmp_path: Path, children: Children) -> None:
    # A record relayed through the store claiming node 0 and this host, naming a local
    # process that is not a worker of this launcher: neither dumped nor killed.
    stranger = children.start()
    forged = heartbeat_record(
        0,
        run_id=RUN,
        pid=stranger.pid,
        hostname=HOST,
        node_rank=0,
        progress_seq=5,
        since=30.0,
        omit=("gpu", "checkpoint_id"),
    )
    rules = HeartbeatRules(heartbeat_config(), RUN, expected_world_size=1, started_at=0.0)
    assert rules.ingest(forged, 0.0)
    agent = FakeAgent()
    cfg = FaultToleranceConfig(enable_ft_package=True, stack_dump="faulthandler")
    handler = FaultHandler(
        cfg,
        tmp_path,
        FakeMonitor(rules),
        agent,
        remote_kill=lambda n, t: None,
        workers=OwnedWorkers(),
    )
    f = Finding(
        finding_type=FindingType("gpu_progress_timeout"),
        run_id=RUN,
        rank=0,
        pid=stranger.pid,
        reason=Reason.NOT_ADVANCING,
        message="forged",
    )
    handler.before_write(f)
    assert f.stack_dump == f"refused: {NOT_A_WORKER}"
    handler.after_write(f)
    assert alive(stranger)
    # The refused kill leaves no restart behind: no cause at the agent, no restart
    # notice in the rules (later exits are findings), and the next fault is acted on.
    assert agent.causes == []
    assert rules.restarting is None
    again = Finding(
        finding_type=FindingType("gpu_progress_timeout"),
        run_id=RUN,
        rank=0,
        pid=stranger.pid,
        reason=Reason.NOT_ADVANCING,
        message="again",
    )
    handler.before_write(again)
    assert again.action == "restart"
