"""A forged record cannot make node 0 allocate per phantom rank.

Every size the rules use is bounded by what the rendezvous allows (``max_world_size``:
max nodes x ranks per node), and ranks that never published are one finding when many.
"""

from __future__ import annotations

import time
import tracemalloc

from rankguard.monitor.rules import NEVER_SEEN_EACH
from rankguard.schema.records import MAX_RANKS, HeartbeatRecord, RecordError
from tests.factories import heartbeat_record as rec
from tests.factories import heartbeat_rules as _rules

NEVER = "rank_process_heartbeat_never_observed"


def test_record_claiming_more_ranks_than_any_job_is_rejected() -> None:
    try:
        HeartbeatRecord.from_dict(rec(0, world_size=10**9))
    except RecordError as exc:
        assert "world_size" in str(exc)
    else:
        raise AssertionError("a world_size past MAX_RANKS was accepted")
    assert HeartbeatRecord.from_dict(rec(0, world_size=MAX_RANKS)).world_size == MAX_RANKS


def test_forged_world_size_in_an_elastic_job_is_bounded() -> None:
    rules = _rules(world=None, started_at=0.0, max_world_size=8)
    assert not rules.ingest(rec(0, 0, world_size=200_000), 0.0)
    assert "world_size" in (rules.last_ignored or "")
    assert rules.ingest(rec(0, 1, world_size=4), 0.0)
    assert rules.world_size() == 4
    assert not rules.ingest(rec(9, 1, world_size=4), 0.0)  # rank past the bound


def test_huge_world_size_without_a_bound_is_quick_and_one_finding() -> None:
    rules = _rules(world=None, started_at=0.0)
    rules.ingest(rec(0, 0, world_size=200_000), 0.0)
    tracemalloc.start()
    t0 = time.perf_counter()
    findings = rules.evaluate(10.5)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    never = [f for f in findings if f.reason == NEVER]
    assert len(never) == 1
    assert never[0].detail["never_seen_count"] == 199_999
    assert never[0].detail["never_seen_ranks"][:3] == [1, 2, 3]
    assert len(never[0].detail["never_seen_ranks"]) <= 32
    assert "199999 ranks" in never[0].message
    assert elapsed < 2.0 and peak < 64 << 20, (elapsed, peak)
    assert rules.evaluate(20.0) == []  # only once


def test_few_never_seen_ranks_stay_one_finding_each() -> None:
    rules = _rules(world=NEVER_SEEN_EACH, started_at=0.0)
    findings = rules.evaluate(10.5)
    assert sorted(f.rank for f in findings) == list(range(NEVER_SEEN_EACH))
    rules = _rules(world=NEVER_SEEN_EACH + 1, started_at=0.0)
    (one,) = rules.evaluate(10.5)
    assert one.rank == 0 and one.detail["never_seen_count"] == NEVER_SEEN_EACH + 1


def test_rank_seen_after_the_aggregate_is_not_reported_again() -> None:
    rules = _rules(world=20, started_at=0.0)
    (one,) = rules.evaluate(10.5)
    assert one.detail["never_seen_count"] == 20
    rules.ingest(rec(3, 1, world_size=20), 11.0)
    assert [f for f in rules.evaluate(11.5) if f.reason == NEVER] == []
