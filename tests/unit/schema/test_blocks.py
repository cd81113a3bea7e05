"""Declared heartbeat blocks: typed round trips, one registry, one way in, typed reads,
one default per field."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.monitor.blockeval import BlockEvaluator
from rankguard.preempt.budget import GraceBudget
from rankguard.preempt.coordinator import PreemptionEvaluator
from rankguard.rank.publisher import HeartbeatPublisher
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.blocks import (
    BLOCKS,
    EXIT_CLEAN_DEFAULT,
    REGISTRY,
    CheckpointBlock,
    ExitBlock,
    FtStatsBlock,
    HeartbeatBlock,
    InProcessBlock,
    InProcessRestart,
    NvrxBlock,
    PerfBlock,
    PerfWindow,
    PreemptBlock,
    StragglerBlock,
    block_registry,
    exit_clean,
    fields_source,
    read_block,
)
from rankguard.schema.collectives import CollectivesBlock, GroupPosition
from rankguard.schema.findings import Progress
from rankguard.schema.records import HeartbeatRecord
from rankguard.schema.rerun import RerunBlock, RerunEvent, RerunOutcome
from tests.factories import heartbeat_record, heartbeat_rules, rank_identity

EXAMPLES: list[Any] = [
    RerunBlock(
        mode="validate_results",
        reruns=1,
        events=(
            RerunEvent(
                seq=1,
                outcome=RerunOutcome.TRANSIENT,
                iteration=5,
                check="loss is NaN",
                message="differed",
                initial=float("nan"),
                rerun=1.5,
            ),
        ),
        stats={"loss": 0.01},
    ),
    InProcessBlock(),
    InProcessBlock(
        restarts=2,
        recovering=True,
        last=InProcessRestart(
            id="run/0/1/1",
            round=1,
            cause="soft_timeout",
            culprit=3,
            culprit_host="h3",
            message="hang",
            wall_time_ns=7,
        ),
    ),
    PreemptBlock(),
    PreemptBlock(signal_received=True, step_min_s=0.01, save_last_s=1.5, save_max_s=2.0),
    CheckpointBlock(checkpoint_count=4),
    ExitBlock(),
    ExitBlock(clean=False, exit_code=-9, error="orphaned", vanished=True, notes={"x": "y"}),
    PerfBlock(step=3, step_time_ms=2.5, windows=(PerfWindow(1, 1, 2.5), PerfWindow(2, None, 3.0))),
    StragglerBlock(compute_ms=12.5, samples=4, method="compute_section_cpu"),
    FtStatsBlock(setup_s=1.5, step_max_s=0.25, steps=3, ckpt_max_s=None, ckpts=0),
    NvrxBlock(connections=1, heartbeats=4, section_events=2, open_sections=("step",)),
    NvrxBlock(
        connections=1,
        heartbeats=4,
        section_events=0,
        calculated_timeouts={"section": {"step": 12.0}},
        iteration=7,
        refused=0,
        errors=2,
    ),
    CollectivesBlock(),
    CollectivesBlock(groups=(GroupPosition("0", 13, 12),), samples=9, waiting=4),
]


def test_every_registered_block_has_an_example() -> None:
    assert {type(b) for b in EXAMPLES} == set(BLOCKS)


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: f"{type(b).__name__}")
def test_round_trip_through_json(block: Any) -> None:
    assert isinstance(block, HeartbeatBlock)  # the protocol, at run time too
    again = type(block).from_dict(json.loads(json.dumps(block.to_dict())))
    if isinstance(block, RerunBlock):  # NaN does not equal itself: compare the JSON
        assert again.to_dict() == block.to_dict()
    else:
        assert again == block


def test_names_are_unique_and_registered_once() -> None:
    assert list(REGISTRY) == [b.name for b in BLOCKS]
    assert len(set(REGISTRY)) == len(BLOCKS)

    class Twin(PerfBlock):
        pass

    with pytest.raises(ValueError, match="'perf' is used twice: PerfBlock and Twin"):
        block_registry((*BLOCKS, Twin))


@pytest.mark.parametrize(
    ("cls", "raw", "message"),
    [
        (InProcessBlock, {"restarts": "1"}, r"inprocess\.restarts"),
        (InProcessBlock, {"restarts": 1, "last": {"id": 3}}, r"inprocess\.last\.id"),
        (InProcessBlock, {"last": {"id": "a", "culprit": "x"}}, r"inprocess\.last\.culprit"),
        (PreemptBlock, {"signal_received": "yes"}, r"preempt\.signal_received"),
        (PreemptBlock, {"save_max_s": -1}, r"preempt\.save_max_s"),
        (CheckpointBlock, {"checkpoint_count": -2}, r"checkpoint\.checkpoint_count"),
        (ExitBlock, {"clean": 1}, r"exit\.clean"),
        (ExitBlock, {"exit_code": "9"}, r"exit\.exit_code"),
        (PerfBlock, [1], r"perf: expected an object"),
    ],
)
def test_a_bad_block_names_the_field(cls: Any, raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls.from_dict(raw)


def test_read_block_from_the_records_fields_its_extra_and_flat_fields() -> None:
    inproc = InProcessBlock(restarts=1, last=InProcessRestart(id="r/0/1/0", culprit=1))
    raw = heartbeat_record(
        0,
        inprocess=inproc.to_dict(),
        preempt={"signal_received": True, "step_min_s": 0.5},
        checkpoint_count=1,
    )
    rec = HeartbeatRecord.from_dict(raw)
    assert read_block(rec, InProcessBlock) == inproc  # a field of the record
    assert read_block(rec, PreemptBlock) == PreemptBlock(signal_received=True, step_min_s=0.5)
    assert read_block(rec, CheckpointBlock) == CheckpointBlock(checkpoint_count=1)  # flat
    bare = HeartbeatRecord.from_dict(heartbeat_record(0))
    assert all(read_block(bare, cls) is None for cls in (InProcessBlock, PreemptBlock))
    assert read_block(bare, CheckpointBlock) is None
    odd = HeartbeatRecord.from_dict(heartbeat_record(0, preempt={"step_min_s": "fast"}))
    with pytest.raises(ValueError, match=r"preempt\.step_min_s"):
        read_block(odd, PreemptBlock)


def test_the_tracker_writes_the_checkpoint_block_fields() -> None:
    tracker = ProgressTracker(mode="cpu")
    tracker.checkpoint_start("c")
    tracker.checkpoint_end()
    snap = dict(tracker.snapshot())
    block = CheckpointBlock.from_dict({k: snap[k] for k in CheckpointBlock.keys})
    assert block.checkpoint_count == 1 and block.saves_in(snap["progress_seq"]) == 1
    assert CheckpointBlock(checkpoint_count=5).saves_in(3) == 0  # absurd: none


def test_fields_source_adapts_a_fields_callable() -> None:
    source = fields_source(PerfBlock, lambda: {"perf": {"step": 1}})
    assert source() == PerfBlock(step=1)
    assert fields_source(PerfBlock, lambda: None)() is None


# ---- the one way in: the publisher writes each source's block ---------------------------


def _records(path: Path, want: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(rows) >= want:
            break
        time.sleep(0.01)
    return rows


def test_the_publisher_writes_blocks_and_survives_a_failing_source(tmp_path: Path) -> None:
    calls = {"n": 0}

    def broken() -> PreemptBlock:
        calls["n"] += 1
        raise RuntimeError("no block today")

    pub = HeartbeatPublisher(
        rank_identity(),
        tmp_path,
        ProgressTracker(mode="cpu"),
        0.02,
        blocks=[lambda: PreemptBlock(signal_received=True), broken],
    )
    pub.add_block(lambda: CheckpointBlock(checkpoint_count=0))  # flat: top-level fields
    pub.add_block(lambda: None)  # nothing this time
    pub.start()
    try:
        rows = _records(pub.path, 3)
    finally:
        pub.close(clean=False, exit_code=3, error="boom")
    beat = next(r for r in rows if r["event"] == "heartbeat")
    assert beat["preempt"] == {"signal_received": True}
    assert beat["checkpoint_count"] == 0 and "checkpoint" not in beat
    assert pub.block_errors == calls["n"] >= 1  # counted, the record still written
    end = [json.loads(x) for x in pub.path.read_text().splitlines()][-1]
    assert ExitBlock.from_dict(end["exit"]) == ExitBlock(clean=False, exit_code=3, error="boom")


def test_two_sources_of_one_block_keep_the_first(tmp_path: Path) -> None:
    pub = HeartbeatPublisher(
        rank_identity(),
        tmp_path,
        ProgressTracker(mode="cpu"),
        0.02,
        blocks=[lambda: PreemptBlock(save_max_s=1.0), lambda: PreemptBlock(save_max_s=9.0)],
    )
    pub.start()
    try:
        rows = _records(pub.path, 2)
    finally:
        pub.close()
    beat = next(r for r in rows if r["event"] == "heartbeat")
    assert beat["preempt"]["save_max_s"] == 1.0 and pub.block_errors >= 1


# ---- one default for exit.clean: the rules and the preemption evaluator agree ----------


@pytest.mark.parametrize(
    ("exit_info", "clean"),
    [
        (None, EXIT_CLEAN_DEFAULT),
        ({"exit_code": 0}, EXIT_CLEAN_DEFAULT),
        ({"clean": True}, True),
        ({"clean": False, "exit_code": 1, "error": "x"}, False),
    ],
)
def test_exit_clean_has_one_default(exit_info: dict[str, Any] | None, clean: bool) -> None:
    assert EXIT_CLEAN_DEFAULT is True  # a rank's own end says clean=false when it knows
    rec = HeartbeatRecord.from_dict(heartbeat_record(0, event="process_end", exit=exit_info))
    assert exit_clean(rec) is clean
    # the rules: a clean end completes the rank, any other is not progress
    rules = heartbeat_rules(1)
    raw = heartbeat_record(0, event="process_end", exit=exit_info, world_size=1)
    rules.ingest(raw, 1.0)
    rules.evaluate(1.0)
    expected = Progress.COMPLETED if clean else Progress.UNKNOWN
    assert rules.ranks[0].progress is expected
    # the preemption evaluator: a clean end at the stop step is no save (only a save the
    # rank reports in its preempt block is)
    coordinator = SimpleNamespace(
        active=True,
        stop_at=1,
        reason="preempted",
        sig=15,
        cfg=SimpleNamespace(preempt_time=30.0),
        summary=lambda: {},
    )
    ev = PreemptionEvaluator(coordinator, GraceBudget(30.0, 1.0), "run")  # type: ignore[arg-type]
    found = ev.evaluate(1.0, rules.ranks)
    saved = [f for f in found if f.detail.get("saved_step") == 1]
    assert saved == []


def test_the_preemption_evaluator_reads_the_save_budget_from_the_blocks() -> None:
    rules = heartbeat_rules(2)
    rules.ingest(heartbeat_record(0, preempt={"save_max_s": 12.0}), 1.0)
    rules.ingest(heartbeat_record(1, preempt={"save_max_s": "slow"}), 1.0)  # bad: counted
    coordinator = SimpleNamespace(active=False, stop_at=None)
    budget = GraceBudget(10.0, 1.0)
    ev = PreemptionEvaluator(coordinator, budget, "run")  # type: ignore[arg-type]
    assert ev.evaluate(1.0, rules.ranks) == []
    assert budget.save_s == 12.0 and not budget.fits()
    assert ev.bad_blocks == 1 and ev.last_bad is not None and "rank 1" in ev.last_bad


def test_the_block_evaluator_base_hands_each_good_block_over() -> None:
    class Seen(BlockEvaluator[PreemptBlock]):
        name = "seen"
        block = PreemptBlock

        def __init__(self) -> None:
            super().__init__()
            self.got: list[tuple[int, bool]] = []
            self.after = 0

        def on_block(self, rank: int, state: Any, block: PreemptBlock, ranks: Any) -> list[Any]:
            self.got.append((rank, block.signal_received))
            return []

        def after_blocks(self, now: float, ranks: Any) -> list[Any]:
            self.after += 1
            return []

    rules = heartbeat_rules(3)
    rules.ingest(heartbeat_record(0, preempt={"signal_received": True}), 1.0)
    rules.ingest(heartbeat_record(1), 1.0)  # no block
    rules.ingest(heartbeat_record(2, preempt={"signal_received": 2}), 1.0)  # bad
    ev = Seen()
    assert ev.evaluate(1.0, rules.ranks) == []
    assert ev.got == [(0, True)] and ev.after == 1 and ev.bad_blocks == 1


def test_straggler_and_ft_stats_blocks_read_wrong_types_as_missing() -> None:
    """The record accepts any object under these names: a forged value reads as
    missing (the detector and the learned timeouts skip it), never raises, and a newer
    writer's keys are kept."""
    straggler = StragglerBlock.from_dict({"compute_ms": "fast", "samples": True, "new": 1})
    assert (straggler.compute_ms, straggler.samples, straggler.method) == (None, None, None)
    assert straggler.to_dict()["new"] == 1
    stats = FtStatsBlock.from_dict({"setup_s": [1], "steps": 2.5, "hb_gap_max_s": 3})
    assert (stats.setup_s, stats.steps, stats.hb_gap_max_s) == (None, None, 3)
    written = {"compute_ms": 3.0, "samples": 2, "method": "step_cpu"}
    assert list(StragglerBlock.from_dict(written).to_dict()) == list(written)


def test_a_perf_block_reads_wrong_types_as_missing_and_keeps_a_newer_writers_keys() -> None:
    block = PerfBlock.from_dict(
        {
            "step": "3",
            "iteration": True,
            "step_time_ms": 12.5,
            "MFU": "high",
            "windows": [[1, 1, 2.5], [2, "x", 1.0], ["3", 3, 1.0], [4, None, None], 5, [6]],
            "newer": {"k": 1},
        }
    )
    assert (block.step, block.iteration, block.step_time_ms, block.MFU) == (None, None, 12.5, None)
    assert block.windows == (PerfWindow(1, 1, 2.5),)
    assert block.to_dict()["newer"] == {"k": 1} and list(block.to_dict())[-1] == "newer"


def test_an_nvrx_block_writes_its_optional_keys_only_when_known() -> None:
    plain = NvrxBlock(connections=1, heartbeats=0, section_events=0)
    assert list(plain.to_dict()) == ["connections", "heartbeats", "section_events", "open_sections"]
    forged = NvrxBlock.from_dict(
        {"connections": "1", "open_sections": ["step", 3], "errors": 2, "iteration": 1.5, "n": 1}
    )
    assert forged.connections is None and forged.open_sections == ("step",)
    assert forged.iteration is None and (forged.refused, forged.errors) == (None, 2)
    assert forged.to_dict()["refused"] is None and forged.to_dict()["n"] == 1
