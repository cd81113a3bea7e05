"""FaultHandler: what the launcher does about a finding (report, restart, abort).

Real child processes stand for the ranks (a dump handler installed, blocked in a named
function), a real HeartbeatRules holds their records; the monitor and the agent are
fakes that record what they are asked to do.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.ft import actions, flightrec
from rankguard.ft.actions import FaultHandler
from rankguard.ft.config import FaultToleranceConfig
from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import Finding, FindingType, Reason
from tests.factories import PLAIN_CHILD, Children, alive, heartbeat_config, heartbeat_record

RUN = "run-actions"
HOST = socket.gethostname()
BUSY = "none (a restart is already under way)"

RANK_CHILD = """\
import sys, time
from rankguard.ft.stacks import install_dump_handler

fh = install_dump_handler(sys.argv[1], int(sys.argv[2]))
assert fh is not None

def blocked_here():
    print("ready", flush=True)
    time.sleep(60)

blocked_here()
"""

# No dump handler: the dump signal (a real-time signal) would terminate it, so it stays
# alive only if nothing is sent to it.


rec = partial(
    heartbeat_record,
    run_id=RUN,
    hostname=HOST,
    progress_seq=5,
    since=0.2,
    omit=("gpu", "checkpoint_id"),
)


class FakeMonitor:
    def __init__(self, rules: HeartbeatRules) -> None:
        self.rules = rules
        self.restarts: list[str] = []

    def note_restart(self, reason: str) -> None:
        self.restarts.append(reason)
        self.rules.note_restart(reason)


class FakeAgent:
    def __init__(self) -> None:
        self.causes: list[tuple[dict[str, Any], bool]] = []

    def set_cause(self, finding: dict[str, Any], *, abort: bool) -> None:
        self.causes.append((finding, abort))

    def withdraw_cause(self, finding: dict[str, Any]) -> None:
        self.causes = [(f, a) for f, a in self.causes if f is not finding]


class RemoteKills:
    def __init__(self) -> None:
        self.calls: list[tuple[int, list[dict[str, Any]]]] = []

    def __call__(self, node: int, targets: list[dict[str, Any]]) -> None:
        self.calls.append((node, targets))


def finding(ftype: str, rank: int, pid: int | None) -> Finding:
    return Finding(
        finding_type=FindingType(ftype),
        run_id=RUN,
        rank=rank,
        pid=pid,
        reason=Reason.NOT_ADVANCING,
        message="test",
    )


def _rules(*records: dict[str, Any]) -> HeartbeatRules:
    rules = HeartbeatRules(
        heartbeat_config(), RUN, expected_world_size=len(records) or None, started_at=0.0
    )
    for r in records:
        assert rules.ingest(r, 0.0)
    return rules


def _handler(
    tmp_path: Path, rules: HeartbeatRules, **cfg: Any
) -> tuple[FaultHandler, FakeMonitor, FakeAgent]:
    cfg.setdefault("stack_dump", "faulthandler")
    cfg.setdefault("stack_dump_timeout_s", 5.0)
    monitor, agent = FakeMonitor(rules), FakeAgent()
    handler = FaultHandler(
        FaultToleranceConfig(enable_ft_package=True, **cfg), tmp_path, monitor, agent
    )
    return handler, monitor, agent


@pytest.fixture(autouse=True)
def _short_trace_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank children here keep no flight recorder: on a hang the handler's request
    for their traces would wait its whole 3 s for nothing; 0.2 s here. The traces and
    the verdict themselves: ``test_flightrec``, ``test_flightrec_trust``."""
    monkeypatch.setattr(
        actions, "collect_verdict", partial(flightrec.collect_verdict, timeout_s=0.2)
    )


@pytest.fixture
def spawn(tmp_path: Path, children: Children) -> Callable[..., subprocess.Popen[str]]:
    """Start a rank child (killed and reaped at the end)."""

    def start(rank: int, *, handler: bool = True) -> subprocess.Popen[str]:
        if not handler:
            return children.start(PLAIN_CHILD)
        return children.start(RANK_CHILD, str(tmp_path), str(rank))

    return start


# ---- report --------------------------------------------------------------------------


def test_report_does_nothing(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(tmp_path, rules, actions={"gpu_progress_timeout": "report"})
    f = finding("gpu_progress_timeout", 0, child.pid)
    handler.before_write(f)
    assert f.action == "report"
    assert f.stack_dumps is None and f.stack_dump is None
    handler.after_write(f)
    assert alive(child)  # neither killed nor sent the dump signal
    assert agent.causes == []
    assert monitor.restarts == []
    assert handler.actions_taken == 0
    assert not (tmp_path / "stacks").exists()
    # Reporting does not make the handler busy: the next fault is acted on.
    g = finding("rank_process_exited", 0, child.pid)
    handler.before_write(g)
    assert g.action == "restart"


def test_health_findings_are_reported_by_default(tmp_path: Path) -> None:
    handler, _, agent = _handler(tmp_path, _rules(rec(0, pid=999_999, world_size=1)))
    for ftype in (
        "gpu_hardware_health_failure",
        "gpu_hardware_health_warning",
        "straggler_detected",
    ):
        f = finding(ftype, 0, 999_999)
        handler.before_write(f)
        handler.after_write(f)
        assert f.action == "report"
    assert agent.causes == []


# ---- restart -------------------------------------------------------------------------


def test_restart_dumps_culprit_first_then_kills_it(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    rank0, rank1 = spawn(0), spawn(1)
    # Rank 1 has not progressed for 25 s (> 20 s) and is behind rank 0: the culprit.
    rules = _rules(rec(0, pid=rank0.pid, progress_seq=7), rec(1, pid=rank1.pid, since=25.0))
    found = rules.evaluate(0.1)
    assert [(f.rank, f.finding_type) for f in found] == [(1, "gpu_progress_timeout")]
    handler, monitor, agent = _handler(tmp_path, rules)

    f = found[0]
    handler.before_write(f)
    assert f.action == "restart"
    assert list(f.stack_dumps) == ["1", "0"]  # the culprit first
    assert f.stack_dump == f.stack_dumps["1"]
    assert f.stack_dump == str(tmp_path / "stacks" / f"rank_1_pid_{rank1.pid}.txt")
    for rank in ("1", "0"):
        assert "blocked_here" in Path(f.stack_dumps[rank]).read_text(encoding="utf-8")
    assert rank1.poll() is None  # dumped, not killed yet

    handler.after_write(f)
    assert agent.causes == [(f.to_dict(), False)]
    assert monitor.restarts == ["restart after gpu_progress_timeout on rank 1"]
    assert rules.restarting == "restart after gpu_progress_timeout on rank 1"
    assert rank1.wait(timeout=5) == -9  # SIGKILL
    assert alive(rank0)  # the agent stops the others
    assert handler.actions_taken == 1


def test_second_finding_while_busy_is_not_acted_on(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    rank0, rank1 = spawn(0), spawn(1)
    rules = _rules(rec(0, pid=rank0.pid), rec(1, pid=rank1.pid))
    handler, monitor, agent = _handler(tmp_path, rules)
    first = finding("gpu_progress_timeout", 1, rank1.pid)
    handler.before_write(first)
    handler.after_write(first)
    assert rank1.wait(timeout=5) == -9

    second = finding("rank_process_heartbeat_timeout", 0, rank0.pid)
    handler.before_write(second)
    assert second.action == BUSY
    assert second.stack_dumps is None
    handler.after_write(second)
    assert len(agent.causes) == 1
    assert len(monitor.restarts) == 1
    assert handler.actions_taken == 1
    assert alive(rank0)
    # A report-only finding is still reported as such while busy.
    health = finding("gpu_hardware_health_failure", 0, rank0.pid)
    handler.before_write(health)
    assert health.action == "report"

    # The agent started a new worker group: the next fault is acted on again.
    handler.restarted()
    third = finding("gpu_progress_timeout", 0, rank0.pid)
    handler.before_write(third)
    assert third.action == "restart"
    assert list(third.stack_dumps) == ["0", "1"]
    assert third.stack_dumps["1"] == "failed"  # rank 1 is gone
    assert "blocked_here" in Path(third.stack_dump).read_text(encoding="utf-8")
    handler.after_write(third)
    assert rank0.wait(timeout=5) == -9
    assert [abort for _, abort in agent.causes] == [False, False]
    assert handler.actions_taken == 2


# ---- abort ---------------------------------------------------------------------------


def test_abort_sets_the_cause_with_abort(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    child = spawn(0)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(tmp_path, rules, actions={"gpu_progress_timeout": "abort"})
    f = finding("gpu_progress_timeout", 0, child.pid)
    handler.before_write(f)
    assert f.action == "abort"
    assert "blocked_here" in Path(f.stack_dump).read_text(encoding="utf-8")
    handler.after_write(f)
    assert agent.causes == [(f.to_dict(), True)]
    assert monitor.restarts == ["abort after gpu_progress_timeout on rank 0"]
    assert child.wait(timeout=5) == -9


# ---- a rank that exited --------------------------------------------------------------


def test_exited_rank_no_dump_no_kill_but_cause(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    # The record's pid is alive and has no dump handler: a dump signal or a kill sent to
    # it would end it.
    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(tmp_path, rules)
    f = finding("rank_process_exited", 0, child.pid)
    handler.before_write(f)
    assert f.action == "restart"
    assert f.stack_dumps is None and f.stack_dump is None
    handler.after_write(f)
    # the agent's own failure report (exit codes, error files) is the restart's cause
    assert agent.causes == []
    assert monitor.restarts == ["restart after rank_process_exited on rank 0"]
    assert alive(child)
    assert not (tmp_path / "stacks").exists()
    # One fault, one action: the exit made the handler busy.
    g = finding("rank_process_heartbeat_timeout", 0, child.pid)
    handler.before_write(g)
    assert g.action == BUSY


def test_a_rank_live_recovery_replaced_is_not_acted_on(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    from rankguard.ft.actions import LIVE_RECOVERY

    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(tmp_path, rules)
    f = finding("rank_process_exited", 0, child.pid)
    f.action = "live recovery: standby pid 9 took rank 0"
    f.detail[LIVE_RECOVERY] = {"standby_pid": 9}
    handler.before_write(f)
    handler.after_write(f)
    assert f.action == "live recovery: standby pid 9 took rank 0"
    assert monitor.restarts == [] and agent.causes == []
    g = finding("rank_process_heartbeat_timeout", 0, child.pid)
    handler.before_write(g)
    assert g.action != BUSY  # not busy: the next fault is acted on


def test_a_heartbeat_timeout_named_at_a_restart_is_not_acted_on(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    # a lost node's rank named when the restart for its peer's broken collective came:
    # its rank number may already belong to the new group's process; nothing is killed
    from rankguard.monitor.rules import NAMED_AT

    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(
        tmp_path, rules, actions={"rank_process_heartbeat_timeout": "restart"}
    )
    f = finding("rank_process_heartbeat_timeout", 0, child.pid)
    f.detail[NAMED_AT] = "restart 1: worker_failed"
    handler.before_write(f)
    handler.after_write(f)
    assert f.action == "none (a restart was already under way: restart 1: worker_failed)"
    assert monitor.restarts == [] and agent.causes == []
    assert alive(child) and not (tmp_path / "stacks").exists()


def test_a_hung_rank_a_standby_replaces_is_killed_once_its_own_stacks_are_in(
    tmp_path: Path, spawn: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live recovery: the survivors keep running, so the culprit is killed as soon as its
    stacks are written, not after every rank's (a stopped rank's kill waited 4 s for the
    others' py-spy dumps on a loaded machine); the finding still names every dump."""
    import rankguard.ft.kill as kill_mod
    from rankguard.util.procs import pid_running

    rank0, rank1 = spawn(0), spawn(1)
    rules = _rules(rec(0, pid=rank0.pid, progress_seq=7), rec(1, pid=rank1.pid, since=25.0))
    (f,) = rules.evaluate(0.1)
    monitor, agent = FakeMonitor(rules), FakeAgent()
    asked: list[int] = []
    handler = FaultHandler(
        FaultToleranceConfig(
            enable_ft_package=True, stack_dump="faulthandler", stack_dump_timeout_s=5.0
        ),
        tmp_path,
        monitor,
        agent,
        replaced_live=lambda rank: asked.append(rank) or True,
    )
    real_dump = kill_mod.dump_stacks
    culprit_gone_during_survivor_dump: list[bool] = []

    natives: dict[int, bool] = {}

    def dump(run_dir: Path, rank: int, pid: int, **kw: Any) -> str | None:
        natives[rank] = kw["native"]
        if rank == 0:  # the survivor's dump: is the culprit gone before it completes?
            deadline = time.monotonic() + 3.0
            while pid_running(rank1.pid) and rank1.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            culprit_gone_during_survivor_dump.append(rank1.poll() is not None)
        return real_dump(run_dir, rank, pid, **kw)

    monkeypatch.setattr(kill_mod, "dump_stacks", dump)
    handler.before_write(f)
    assert asked == [1]
    assert culprit_gone_during_survivor_dump == [True]
    assert rank1.returncode == -9 and alive(rank0)
    assert handler.killed(1, rank1.pid) and not handler.killed(0, rank0.pid)
    # the survivor keeps running: not paused for native frames (the culprit may be)
    assert natives == {1: True, 0: False}
    assert f.action == "restart" and list(f.stack_dumps) == ["1", "0"]
    assert "blocked_here" in Path(f.stack_dumps["1"]).read_text(encoding="utf-8")
    assert "blocked_here" in Path(f.stack_dumps["0"]).read_text(encoding="utf-8")
    assert monitor.restarts == ["restart after gpu_progress_timeout on rank 1"]
    ((cause, abort),) = agent.causes  # given once, before the dumps, completed after
    assert not abort and cause["stack_dumps"] == f.stack_dumps
    handler.after_write(f)  # nothing left to do
    assert handler.actions_taken == 1 and monitor.restarts == [
        "restart after gpu_progress_timeout on rank 1"
    ]
    assert alive(rank0)


# ---- a culprit on another node -------------------------------------------------------


def _remote_rules() -> HeartbeatRules:
    return _rules(
        rec(0, pid=4101, hostname="node-b", node_rank=1, world_size=3),
        rec(1, pid=4102, hostname="node-b", node_rank=1, world_size=3, since=30.0),
        rec(2, pid=4103, hostname="node-c", node_rank=2, world_size=3),
    )


def test_remote_culprit_is_dumped_and_killed_by_its_node(tmp_path: Path) -> None:
    rules = _remote_rules()
    remote = RemoteKills()
    monitor, agent = FakeMonitor(rules), FakeAgent()
    cfg = FaultToleranceConfig(enable_ft_package=True, stack_dump="faulthandler")
    handler = FaultHandler(cfg, tmp_path, monitor, agent, remote_kill=remote)
    f = finding("gpu_progress_timeout", 1, 4102)
    handler.before_write(f)
    assert f.action == "restart"
    assert list(f.stack_dumps) == ["1", "0", "2"]
    assert f.stack_dumps["1"].startswith("on node 1")
    assert f.stack_dumps["2"].startswith("on node 2")
    assert not (tmp_path / "stacks").exists()  # nothing dumped here
    handler.after_write(f)
    assert agent.causes == [(f.to_dict(), False)]
    assert len(remote.calls) == 1
    node, targets = remote.calls[0]
    assert node == 1
    assert targets[0] == {"rank": 1, "pid": 4102, "kill": True}  # the culprit first
    assert {"rank": 0, "pid": 4101} in targets  # its node's other ranks, to be dumped
    assert all(t["pid"] != 4103 for t in targets)  # not another node's ranks
    assert [t for t in targets if t.get("kill")] == [targets[0]]


def test_remote_kill_lists_the_culprit_once(tmp_path: Path) -> None:
    remote = RemoteKills()
    monitor = FakeMonitor(_remote_rules())
    cfg = FaultToleranceConfig(enable_ft_package=True)
    handler = FaultHandler(cfg, tmp_path, monitor, FakeAgent(), remote_kill=remote)
    f = finding("gpu_progress_timeout", 1, 4102)
    f.action = "restart"
    handler.after_write(f)
    assert [t["rank"] for t in remote.calls[0][1]] == [1, 0]


def test_remote_culprit_without_remote_kill_leaves_no_restart_mark(tmp_path: Path) -> None:
    # Nothing can kill it, so nothing restarts: no cause at the agent, no restart notice
    # in the rules (a later exit is a finding, not the restart's doing), not busy.
    monitor, agent = FakeMonitor(_remote_rules()), FakeAgent()
    handler = FaultHandler(FaultToleranceConfig(enable_ft_package=True), tmp_path, monitor, agent)
    f = finding("gpu_progress_timeout", 1, 4102)
    f.action = "restart"
    handler.after_write(f)  # logs that the node cannot be reached; no exception
    assert agent.causes == []
    assert monitor.rules.restarting is None
    later = finding("gpu_progress_timeout", 1, 4102)
    handler.before_write(later)
    assert later.action is not None and "already under way" not in later.action


def test_never_observed_rank_does_not_leave_the_handler_busy(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    child = spawn(0)
    rules = HeartbeatRules(heartbeat_config(), RUN, expected_world_size=2, started_at=0.0)
    assert rules.ingest(rec(0, pid=child.pid), 0.0)
    assert rules.ingest(rec(0, pid=child.pid, seq=2), 10.5)
    never = rules.evaluate(11.0)  # rank 1 never published a heartbeat
    assert [(f.rank, f.reason) for f in never] == [(1, "rank_process_heartbeat_never_observed")]
    handler, _, _ = _handler(tmp_path, rules)
    handler.before_write(never[0])
    handler.after_write(never[0])
    if alive(child):
        # Nothing was killed, so no restart will re-arm the handler: a later hang of
        # rank 0 must still be acted on.
        later = finding("gpu_progress_timeout", 0, child.pid)
        handler.before_write(later)
        assert later.action == "restart"


def test_rank_of_another_node_on_this_host_is_left_to_that_node(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    # Two launchers on one host (loopback): node 1's rank writes its stacks into node
    # 1's run directory, so node 1's relay dumps and kills it, not this handler.
    node1_rank = spawn(1)
    rules = _rules(
        rec(0, pid=999_999, node_rank=0),
        rec(1, pid=node1_rank.pid, node_rank=1, since=30.0),
    )
    remote = RemoteKills()
    monitor, agent = FakeMonitor(rules), FakeAgent()
    cfg = FaultToleranceConfig(enable_ft_package=True, stack_dump="faulthandler")
    handler = FaultHandler(cfg, tmp_path, monitor, agent, remote_kill=remote)
    f = finding("gpu_progress_timeout", 1, node1_rank.pid)
    handler.before_write(f)
    assert (f.stack_dump or "").startswith("on node 1")
    # its handler's file (created at start-up) stays empty: no dump signal from here
    assert (tmp_path / "stacks" / f"rank_1_pid_{node1_rank.pid}.txt").read_text() == ""
    handler.after_write(f)
    assert remote.calls == [(1, [{"rank": 1, "pid": node1_rank.pid, "kill": True}])]
    assert alive(node1_rank)  # not killed from here


# ---- failures while acting -----------------------------------------------------------------


class BrokenAgent(FakeAgent):
    def set_cause(self, finding: dict[str, Any], *, abort: bool) -> None:
        raise RuntimeError("agent gone")


def test_a_failed_action_does_not_leave_the_handler_busy(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    rank0, rank1 = spawn(0), spawn(1)
    rules = _rules(rec(0, pid=rank0.pid), rec(1, pid=rank1.pid))
    monitor = FakeMonitor(rules)
    handler = FaultHandler(
        FaultToleranceConfig(enable_ft_package=True, stack_dump="faulthandler"),
        tmp_path,
        monitor,
        BrokenAgent(),
    )
    first = finding("gpu_progress_timeout", 1, rank1.pid)
    handler.before_write(first)
    assert first.action == "restart"
    with pytest.raises(RuntimeError):
        handler.after_write(first)  # the monitor logs and counts it
    assert handler.action_errors == 1
    assert alive(rank1)  # the action stopped before the kill

    handler.agent = FakeAgent()
    second = finding("gpu_progress_timeout", 1, rank1.pid)
    handler.before_write(second)
    assert second.action == "restart"  # not "a restart is already under way"
    handler.after_write(second)
    assert rank1.wait(timeout=5) == -9


def test_a_failed_stack_dump_does_not_prevent_the_kill(
    tmp_path: Path, spawn: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rankguard.ft.actions as actions_mod

    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, _, agent = _handler(tmp_path, rules)

    def no_space(*args: Any, **kw: Any) -> list[Any]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(actions_mod, "dump_stacks_of", no_space)
    f = finding("gpu_progress_timeout", 0, child.pid)
    handler.before_write(f)
    assert f.action == "restart"
    assert f.stack_dumps == {} and f.stack_dump is None
    assert "No space left on device" in f.to_dict()["stack_dump_errors"]["0"]
    handler.after_write(f)
    assert child.wait(timeout=5) == -9
    assert len(agent.causes) == 1


def test_a_rank_whose_dump_failed_is_named_with_the_reason(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    rank0 = spawn(0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rules = _rules(rec(0, pid=rank0.pid), rec(1, pid=gone.pid))
    handler, _, _ = _handler(tmp_path, rules)
    f = finding("gpu_progress_timeout", 0, rank0.pid)
    handler.before_write(f)
    assert f.stack_dumps is not None and f.stack_dumps["1"] == "failed"
    assert f.detail["stack_dump_errors"] == {"1": "not running"}
    handler.after_write(f)
    assert rank0.wait(timeout=5) == -9


def test_node_disk_full_is_reported_not_acted_on(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    child = spawn(0, handler=False)
    rules = _rules(rec(0, pid=child.pid, world_size=1))
    handler, monitor, agent = _handler(tmp_path, rules)
    f = finding("node_disk_full", 0, child.pid)
    handler.before_write(f)
    assert f.action == "report" and f.stack_dumps is None
    handler.after_write(f)
    assert alive(child)
    assert agent.causes == [] and monitor.restarts == []
