"""``--preload``'s wait for the fork server (:mod:`rankguard.launcher.forkwait`): the
monitor is told the launcher waits for the fork, then when it forked; a fork server
still importing past the initial timeout is said in one line, once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rankguard.launcher.forkwait import ForkWait
from tests.factories import FakeClock
from tests.factories import heartbeat_rules as _rules


def _wait(clock: FakeClock, said: list[str], monitor: Any) -> ForkWait:
    return ForkWait(("torch", "numpy"), 0.0, 30.0, said.append, lambda: monitor, clock=clock)


def test_a_fork_server_still_importing_is_said_once_and_the_monitor_waits() -> None:
    clock = FakeClock(2.0)
    rules = _rules(world=2, started_at=2.0)
    monitor = SimpleNamespace(rules=rules, clock=clock)
    said: list[str] = []
    wait = _wait(clock, said, monitor)
    wait.forking()
    assert rules.ranks_forking
    clock.t = 32.5
    wait.still_importing()  # the timer's call
    wait.still_importing()
    assert said == [
        "--preload torch,numpy: the fork server has imported for 32.5s and has not forked "
        "the ranks yet; initial_process_timeout_s=30 counts from their fork"
    ]
    assert rules.evaluate(32.5) == []  # not "never seen"
    clock.t = 40.0
    wait.forked()
    assert not rules.ranks_forking and rules.ranks_forked_at == 40.0
    assert wait.imported_s == 40.0
    wait.forking()  # a restart: the fork server imported already, nothing said
    clock.t = 80.0
    wait.still_importing()
    wait.forked()
    assert len(said) == 1 and wait.imported_s == 40.0


def test_forked_within_the_timeout_nothing_is_said_and_no_monitor_is_no_error() -> None:
    clock = FakeClock(0.0)
    said: list[str] = []
    wait = _wait(clock, said, None)  # another node: no monitor here
    wait.forking()
    clock.t = 5.0
    wait.forked()
    wait.still_importing()  # a timer that fired as the fork returned
    assert said == [] and wait.imported_s == 5.0
