"""A restart that never happens (a forged process_end: no worker failed) does not
disarm fault tolerance: the busy state ends when the agent sees no group failure within
the grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankguard.ft.actions import FaultHandler
from rankguard.ft.config import FaultToleranceConfig
from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import Finding, FindingType, Reason
from tests.factories import FakeClock, heartbeat_config, heartbeat_record

RUN = "run-busy"
BUSY = "none (a restart is already under way)"


class Monitor:
    def __init__(self, rules: HeartbeatRules) -> None:
        self.rules = rules

    def note_restart(self, reason: str) -> None:
        self.rules.note_restart(reason)


class Agent:
    def __init__(self) -> None:
        self.causes: list[dict[str, Any]] = []

    def set_cause(self, finding: dict[str, Any], *, abort: bool) -> None:
        self.causes.append(finding)

    def withdraw_cause(self, finding: dict[str, Any]) -> None:
        self.causes = [f for f in self.causes if f is not finding]


def _finding(ftype: FindingType, rank: int) -> Finding:
    return Finding(ftype, RUN, rank, Reason.NOT_ADVANCING, "test", pid=4000 + rank)


def _handler(clock: FakeClock) -> tuple[FaultHandler, HeartbeatRules]:
    rules = HeartbeatRules(heartbeat_config(), RUN, expected_world_size=2, started_at=0.0)
    for rank in (0, 1):  # on another host: this handler kills nothing itself
        rules.ingest(heartbeat_record(rank, run_id=RUN, hostname="elsewhere"), 0.0)
    cfg = FaultToleranceConfig(enable_ft_package=True)
    handler = FaultHandler(
        cfg, Path("."), Monitor(rules), Agent(), remote_kill=lambda n, t: None, clock=clock
    )
    return handler, rules


def _act(handler: FaultHandler, f: Finding) -> str | None:
    handler.before_write(f)
    handler.after_write(f)
    return f.action


def test_a_restart_that_never_comes_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    handler, rules = _handler(clock)
    assert _act(handler, _finding(FindingType.PROCESS_EXITED, 1)) == "restart"  # forged
    clock.t += handler.busy_grace_s / 2
    assert _act(handler, _finding(FindingType.PROGRESS_TIMEOUT, 0)) == BUSY
    clock.t += handler.busy_grace_s
    hang = _finding(FindingType.PROGRESS_TIMEOUT, 0)
    assert _act(handler, hang) == "restart"  # a real hang later is acted on
    assert rules.restarting is not None and "rank 0" in rules.restarting


def test_a_group_failure_keeps_the_restart_under_way() -> None:
    clock = FakeClock()
    handler, _ = _handler(clock)
    assert _act(handler, _finding(FindingType.PROGRESS_TIMEOUT, 1)) == "restart"
    handler.group_failed()  # the agent saw the group fail: its restart follows
    clock.t += handler.busy_grace_s * 10
    assert _act(handler, _finding(FindingType.PROGRESS_TIMEOUT, 0)) == BUSY
    handler.restarted()
    assert _act(handler, _finding(FindingType.PROGRESS_TIMEOUT, 0)) == "restart"


def test_grace_covers_the_dumps_and_the_termination() -> None:
    cfg = FaultToleranceConfig(
        enable_ft_package=True, stack_dump_timeout_s=20.0, termination_grace_s=15.0
    )
    rules = HeartbeatRules(heartbeat_config(), RUN, expected_world_size=1, started_at=0.0)
    handler = FaultHandler(cfg, Path("."), Monitor(rules), Agent())
    assert handler.busy_grace_s >= 2 * 20.0 + 15.0
