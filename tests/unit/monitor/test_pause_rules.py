"""A paused process (SIGSTOP, then SIGCONT): late heartbeats are not "alive and not
progressing", and the progress clock restarts when its heartbeats come back."""

from __future__ import annotations

from typing import Any

from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import Liveness, Progress
from tests.factories import heartbeat_config, heartbeat_record, types_of

RUN = "run-pause"
IN_COLLECTIVE = "distributed_c10d.py:10 in all_reduce"


def _rules(world: int = 2) -> HeartbeatRules:
    # heartbeats every second, scans every second: fresh for 3 s
    cfg = heartbeat_config(progress_timeout_s=4.0, process_timeout_s=10.0)
    return HeartbeatRules(cfg, RUN, expected_world_size=world, started_at=0.0)


class _Rank:
    """One rank's publisher: a record a call, its own monotonic clock in the record."""

    def __init__(self, rules: HeartbeatRules, rank: int) -> None:
        self.rules, self.rank = rules, rank
        self.seq = 0
        self.steps = 1
        self.last_step = 0.0

    def beat(self, now: float, *, step: bool, **kw: Any) -> None:
        if step:
            self.steps += 1
            self.last_step = now
        self.seq += 1
        kw.setdefault("world_size", self.rules.expected_world_size)
        rec = heartbeat_record(
            self.rank,
            self.seq,
            run_id=RUN,
            t=now,
            progress_seq=self.steps,
            since=round(now - self.last_step, 3),
            monotonic_ns=int(now * 1e9),
            **kw,
        )
        assert self.rules.ingest(rec, now)


def test_a_stopped_rank_gets_the_heartbeat_timeout_only_and_no_progress_finding() -> None:
    rules = _rules()
    ranks = [_Rank(rules, 0), _Rank(rules, 1)]
    found: list[tuple[int, str]] = []
    t = 0.0
    while t < 10.0:  # both train
        t += 1.0
        for r in ranks:
            r.beat(t, step=True)
        found += types_of(rules.evaluate(t))
    assert found == []
    # rank 1 is stopped at t=10 in the middle of its step; rank 0 waits for it in the
    # next collective: its heartbeats go on, its steps do not
    states: list[tuple[Liveness, Progress]] = []
    while t < 24.0:
        t += 1.0
        ranks[0].beat(t, step=False, main_frame=IN_COLLECTIVE)
        found += types_of(rules.evaluate(t))
        states.append((rules.ranks[1].liveness, rules.ranks[1].progress))
    assert found == [(1, "rank_process_heartbeat_timeout")]
    assert (Liveness.ALIVE, Progress.UNKNOWN) in states  # late: not judged on progress
    assert states[-1] == (Liveness.STALE, Progress.UNKNOWN)
    assert rules.ranks[0].progress is Progress.STALLED and rules.ranks[0].blocked_by == [1]
    # continued at t=24: its first record says 14 s without a step (the stopped time)
    ranks[1].beat(t + 0.1, step=False)
    for _ in range(10):
        t += 1.0
        for r in ranks:
            r.beat(t, step=True)
        found += types_of(rules.evaluate(t))
        assert rules.ranks[1].progress is Progress.PROGRESSING
    assert found == [(1, "rank_process_heartbeat_timeout")]


def test_after_a_pause_the_progress_clock_restarts() -> None:
    rules = _rules(world=1)
    rank = _Rank(rules, 0)
    t = 0.0
    for _ in range(3):
        t += 1.0
        rank.beat(t, step=True)
        rules.evaluate(t)
    # stopped for 8 s (less than the process timeout), then continued: its first record
    # says 8 s since the last step, more than the progress timeout (4 s)
    for now in (5.0, 8.0, 11.0):
        assert [f for f in rules.evaluate(now) if f.rank == 0] == []
    t = 11.0
    rank.beat(t, step=False)
    assert [f for f in rules.evaluate(t) if f.rank == 0] == []
    assert rules.ranks[0].progress is Progress.PROGRESSING
    assert rules.ranks[0].progress_age_s is not None and rules.ranks[0].progress_age_s > 4.0
    # a clock restarted, not switched off: no step for 4 s after it came back is a stall
    fired: list[tuple[int, str]] = []
    for _ in range(6):
        t += 1.0
        rank.beat(t, step=False)
        fired += [(f.rank, f.finding_type.value) for f in rules.evaluate(t) if f.rank == 0]
    assert fired == [(0, "gpu_progress_timeout")]


def test_a_slow_but_regular_publisher_is_not_a_pause() -> None:
    """Records 1.5 intervals apart (a loaded machine) keep the progress clock as it is."""
    rules = _rules(world=1)
    rank = _Rank(rules, 0)
    t = 0.0
    rank.beat(t, step=True)
    fired: list[str] = []
    for _ in range(6):  # no step: a stall after 4 s
        t += 1.5
        rank.beat(t, step=False)
        fired += [f.finding_type.value for f in rules.evaluate(t) if f.rank == 0]
    assert fired == ["gpu_progress_timeout"]
    assert rules.ranks[0].resumed_at is None
