"""The verdicts composed: a verdict not due is not evaluated, and a rank's due time is
the earliest of its rank verdicts'.

Timeouts (``tests.factories.heartbeat_config``): process 10 s, initial process 10 s,
progress 20 s.
"""

from __future__ import annotations

import math

import pytest

from rankguard.monitor.rules import RankState
from rankguard.monitor.verdicts import Compose, JobView, NeverSeen, RankVerdicts, StallCulprits
from rankguard.schema.findings import Finding
from tests.factories import Feed, types_of
from tests.factories import heartbeat_rules as _rules


class _Spy:
    """A job verdict due at ``due``, counting its evaluations."""

    def __init__(self, due: float) -> None:
        self.due = due
        self.calls = 0

    def next_due(self, view: JobView, now: float) -> float:
        return self.due

    def evaluate(self, view: JobView, now: float) -> list[Finding]:
        self.calls += 1
        return []


def test_compose_evaluates_only_the_verdicts_due() -> None:
    rules = _rules(world=1)
    early, late, always = _Spy(5.0), _Spy(50.0), _Spy(-math.inf)
    compose = Compose(early, late, always)
    compose.evaluate(rules, 1.0)
    assert (early.calls, late.calls, always.calls) == (0, 0, 1)
    compose.evaluate(rules, 5.0)
    assert (early.calls, late.calls, always.calls) == (1, 0, 2)


def _count_calls(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[float]:
    calls: list[float] = []
    original = cls.evaluate

    def spy(self: object, view: JobView, now: float) -> list[Finding]:
        calls.append(now)
        return original(self, view, now)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "evaluate", spy)
    return calls


def test_the_stall_verdict_runs_only_while_a_rank_is_stalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_calls(monkeypatch, StallCulprits)
    rules = _rules(world=2)
    feed = Feed(rules)
    for t in range(0, 30):
        feed.beat(0, t, progress_seq=t + 1, since=0.2)
        feed.beat(1, t, progress_seq=t + 1, since=0.2)
        assert rules.evaluate(t + 0.5) == []
    assert calls == []  # no rank stalled: never evaluated
    findings: list[Finding] = []
    for t in range(30, 60):
        feed.beat(0, t, progress_seq=30, since=float(t - 30))  # rank 0 stops at step 30
        feed.beat(1, t, progress_seq=t + 1, since=0.2)
        findings += rules.evaluate(t + 0.5)
    assert types_of(findings) == [(0, "gpu_progress_timeout")]
    assert calls and calls[0] == 50.5  # from the scan that found it stalled (20.5 s > 20 s)
    feed.beat(0, 60, progress_seq=31, since=0.1)  # it moves again
    feed.beat(1, 60, progress_seq=61, since=0.2)
    rules.evaluate(60.5)  # clears the stall (the verdict runs once more to see it gone)
    seen = len(calls)
    for t in range(61, 70):
        feed.beat(0, t, progress_seq=t - 29, since=0.2)
        feed.beat(1, t, progress_seq=t + 1, since=0.2)
        assert rules.evaluate(t + 0.5) == []
    assert len(calls) == seen


def test_never_seen_ranks_are_not_looked_for_before_the_initial_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _count_calls(monkeypatch, NeverSeen)
    rules = _rules(world=2)
    feed = Feed(rules)
    for t in range(0, 12):
        feed.beat(0, t, progress_seq=t + 1, since=0.2)
        findings = rules.evaluate(t + 0.5)
        assert (findings != []) == (t == 10)
    assert calls == [10.5, 11.5]  # first seen at 0: due once 10 s have passed


def test_a_ranks_due_time_is_the_earliest_of_its_verdicts() -> None:
    rules = _rules(world=1)
    Feed(rules).beat(0, 0, progress_seq=3, since=1.0)
    rules.evaluate(0.5)
    s = rules.ranks[0]
    verdicts = rules.rank_verdicts
    dues = [v.due(rules, s) for v in (*verdicts.settle, *verdicts.checks)]
    assert rules.rank_verdicts.due(rules, s) == pytest.approx(min(dues) - 1e-6)
    assert rules.next_due() == pytest.approx(min(dues) - 1e-6)


class _Maintenance:
    """A rank verdict of its own: a rank in phase ``maintenance`` is settled (progress
    not judged), and it wants the rank again at ``due``."""

    def __init__(self, due: float) -> None:
        self.at = due
        self.asked: list[int] = []

    def evaluate(self, view: JobView, s: RankState, now: float, out: list[Finding]) -> bool:
        self.asked.append(s.rank)
        return s.record is not None and s.record.phase == "maintenance"

    def due(self, view: JobView, s: RankState) -> float:
        return self.at


def test_a_rank_verdict_added_settles_its_ranks_and_joins_their_due_time() -> None:
    rules = _rules(world=2)
    extra = _Maintenance(due=0.75)
    default = rules.rank_verdicts
    rules.rank_verdicts = RankVerdicts(
        settle=(*default.settle[:-1], extra, default.settle[-1]), checks=default.checks
    )
    feed = Feed(rules)
    feed.beat(0, 0, progress_seq=5, since=0.0, phase="maintenance")
    feed.beat(1, 0, progress_seq=1, since=0.2)
    findings = rules.evaluate(0.5)
    assert rules.next_due() == pytest.approx(0.75 - 1e-6)  # the earliest due of any verdict
    for t in range(1, 30):
        feed.beat(0, t, progress_seq=5, since=float(t), phase="maintenance")
        feed.beat(1, t, progress_seq=t + 1, since=0.2)
        findings += rules.evaluate(t + 0.5)
    assert findings == []  # rank 0 made no progress for 30 s, settled by the new verdict
    assert rules.ranks[0].stall is None and 1 in extra.asked
