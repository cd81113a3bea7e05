"""The rank-side channel: the heartbeat's ``rerun`` block, validated on ingest, and the
monitor's evaluator that turns each outcome into one finding."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rankguard.monitor.rules import RankState
from rankguard.rerun.evaluator import RerunEvaluator
from rankguard.schema.findings import FindingType, Reason
from rankguard.schema.records import HeartbeatRecord, RecordError
from rankguard.schema.rerun import RerunBlock, RerunEvent, RerunOutcome
from tests.factories import heartbeat_record

pytestmark = pytest.mark.timeout(30)


def _event(seq: int, outcome: RerunOutcome, **kw: Any) -> RerunEvent:
    base: dict[str, Any] = {
        "seq": seq,
        "outcome": outcome,
        "iteration": 7,
        "check": "loss is NaN or Inf",
        "message": f"event {seq}",
        "initial": math.nan,
        "rerun": 2.5,
    }
    return RerunEvent(**(base | kw))


def _state(rank: int, pid: int, events: list[RerunEvent], **stats: float) -> RankState:
    block = RerunBlock(mode="validate_results", reruns=len(events), events=tuple(events))
    block = RerunBlock(mode=block.mode, reruns=block.reruns, events=block.events, stats=stats)
    raw = heartbeat_record(rank, pid=pid, rerun=block.to_dict())
    rec = HeartbeatRecord.from_dict(raw)
    return RankState(rank=rank, pid=pid, record=rec)


def test_block_round_trips_through_json_without_nan() -> None:
    block = RerunBlock(
        mode="validate_results",
        reruns=1,
        events=(_event(1, RerunOutcome.VALIDATION_FAILED, faulty_hostname="n7", faulty_gpu="cpu"),),
        stats={"loss": 0.25},
    )
    d = block.to_dict()
    assert d["events"][0]["initial"] == "nan"  # JSON has no NaN
    back = RerunBlock.from_dict(d)
    assert back.events[0].faulty_hostname == "n7" and math.isnan(back.events[0].initial or 0)
    assert back.stats == {"loss": 0.25}


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ([], "expected an object"),
        ({"mode": 3}, "rerun.mode"),
        ({"mode": "x", "reruns": -1}, "rerun.reruns"),
        ({"mode": "x", "events": [{"seq": 1, "iteration": 1, "outcome": "odd"}]}, "outcome"),
        ({"mode": "x", "events": [{"seq": "1", "iteration": 1}]}, "integers"),
        ({"mode": "x", "stats": {"loss": "big"}}, "rerun"),
    ],
)
def test_a_bad_block_rejects_the_record(block: Any, match: str) -> None:
    with pytest.raises(RecordError, match=match):
        HeartbeatRecord.from_dict(heartbeat_record(0, rerun=block))


def test_each_outcome_is_one_finding_once() -> None:
    ev = RerunEvaluator("run1")
    transient = _event(1, RerunOutcome.TRANSIENT, action="continue")
    first = ev.evaluate(0.0, {1: _state(1, 100, [transient])})
    assert [(f.finding_type, f.rank, f.reason) for f in first] == [
        (FindingType.RERUN_TRANSIENT_FAULT, 1, Reason.RERUN_DIFFERED_IN_PLACE)
    ]
    assert first[0].iteration == 7 and first[0].detail["initial_result"] == "nan"
    assert ev.evaluate(1.0, {1: _state(1, 100, [transient])}) == []  # the same record again
    persistent = _event(2, RerunOutcome.PERSISTENT, action="exit_16")
    again = ev.evaluate(2.0, {1: _state(1, 100, [transient, persistent])})
    assert [f.finding_type for f in again] == [FindingType.RERUN_PERSISTENT_FAULT]
    # the resumed process starts its own sequence: seq 1 is new for the new pid
    failed = _event(1, RerunOutcome.VALIDATION_FAILED, faulty_hostname="n7", faulty_gpu="cpu")
    after = ev.evaluate(3.0, {1: _state(1, 200, [failed])})
    assert [f.finding_type for f in after] == [FindingType.RERUN_VALIDATION_FAILED]
    assert after[0].detail["faulty_hostname"] == "n7" and after[0].pid == 200


def test_status_joins_the_ranks_determinism_stats() -> None:
    ev = RerunEvaluator("run1")
    assert ev.status() is None
    ev.evaluate(0.0, {0: _state(0, 10, [], loss=0.01), 1: _state(1, 11, [], loss=0.2)})
    status = ev.status()
    assert status is not None
    assert status["max_relative_diff"] == {"loss": 0.2} and status["worst_rank"] == {"loss": 1}
