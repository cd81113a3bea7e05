"""Typed status blocks: the registry, each block read back to the dict it was written
from, values of the wrong type read as missing, and ``StatusDoc.block(Cls)``."""

from __future__ import annotations

from typing import Any

from rankguard.config import RankguardConfig
from rankguard.launcher.services import node_cadence
from rankguard.schema.coerce import as_finite, as_float, as_int, as_list, as_number, as_str
from rankguard.schema.restarts import LiveBlock, RestartCause, RestartEntry, RestartsBlock
from rankguard.schema.status import StatusDoc
from rankguard.schema.statusblocks import (
    STATUS_BLOCKS,
    CheckpointsBlock,
    PreemptBudget,
    PreemptionBlock,
    StragglerRow,
    StragglersBlock,
    StragglerScores,
    TimeoutsBlock,
)

CHECKPOINTS: dict[str, Any] = {  # as CheckpointRecord.to_json() writes it
    "rank": 0,
    "world_size": 4,
    "job": "job-1",
    "async_save": True,
    "last_committed": {"persistent": 20, "local": None},
    "saves": {"persistent": 2, "local": 0},
    "failures": 1,
    "last_error": "checkpoint step 10 (persistent) FAILED",
    "last": {
        "persistent": {
            "step": 20,
            "path": "/ckpt/step_00000020",
            "time": "2026-12-06T03:00:00.000+00:00",
            "stage_s": 0.12,
            "write_s": 1.5,
            "total_s": 1.7,
        },
        "local": None,
    },
    "inflight": {"tier": "persistent", "step": 30, "since": "2026-12-06T03:01:00.000+00:00"},
    "loaded": {"tier": "local", "step": 5, "path": "/local"},
    "updated": "2026-12-06T03:01:00.000+00:00",
}


def test_the_registry_names_each_block_by_its_key() -> None:
    assert STATUS_BLOCKS["checkpoints"] is CheckpointsBlock
    assert STATUS_BLOCKS["timeouts"] is TimeoutsBlock


def test_a_checkpoints_block_reads_back_to_what_was_written() -> None:
    block = CheckpointsBlock.from_dict(CHECKPOINTS)
    assert block is not None
    assert block.to_dict() == CHECKPOINTS
    assert list(block.to_dict()) == list(CHECKPOINTS)  # the keys in their order
    assert block.last_committed == {"persistent": 20, "local": None}
    entry = block.last["persistent"]
    assert entry is not None and entry.step == 20 and entry.write_s == 1.5
    assert block.inflight is not None and block.inflight.step == 30
    assert block.loaded is not None and block.loaded.tier == "local"


def test_wrong_types_read_as_missing_never_raise() -> None:
    forged = {
        **CHECKPOINTS,
        "failures": "many",
        "last_committed": {"persistent": "20", "local": [1]},
        "last": {"persistent": "x", "local": {"step": True, "stage_s": "slow"}},
        "inflight": 7,
        "extra_key": {"kept": 1},
    }
    block = CheckpointsBlock.from_dict(forged)
    assert block is not None
    assert block.failures == 0 and block.last_committed == {"persistent": None, "local": None}
    assert block.last["persistent"] is None
    local = block.last["local"]
    assert local is not None and local.step is None and local.stage_s is None
    assert block.inflight is None and block.to_dict()["extra_key"] == {"kept": 1}
    assert CheckpointsBlock.from_dict(["not", "a", "block"]) is None


def test_status_doc_hands_out_typed_blocks() -> None:
    timeouts = node_cadence(RankguardConfig()).in_force()
    doc = StatusDoc.from_dict({"checkpoints": CHECKPOINTS, "timeouts": timeouts})
    block = doc.block(CheckpointsBlock)
    assert isinstance(block, CheckpointsBlock) and block.world_size == 4
    shown = doc.block(TimeoutsBlock)
    assert shown is not None and shown.to_dict() == timeouts
    assert shown.entries["phase.step"].value == 300.0
    assert doc.block("checkpoints") == CHECKPOINTS  # by name: as it was
    assert StatusDoc.from_dict({}).block(CheckpointsBlock) is None


def test_one_coercion_module() -> None:
    assert (as_int(3), as_int(True), as_int(3.0)) == (3, None, None)
    assert (as_number(2.5), as_number(False), as_number("1")) == (2.5, None, None)
    assert as_float(2) == 2.0 and isinstance(as_float(2), float)
    assert as_finite(float("inf")) is None and as_float(float("inf")) == float("inf")
    assert (as_str("a"), as_str(1)) == ("a", None)
    assert (as_list((1,)), as_list([1])) == ([], [1])


PROCESS = {  # as the launcher's node services write a process restart
    "schema_version": 1,
    "kind": "process",
    "run_id": "r",
    "restart": 1,
    "wall_time": "2026-12-06T03:00:00.000+00:00",
    "cause": "worker_failed",
    "rank": 1,
    "reason": None,
    "message": "Signal 9 (SIGKILL) received by PID 99",
    "exit_code": -9,
    "stack_dump": None,
    "decision": "restart",
    "rule": "transient",
}
INPROCESS = {  # an in-process restart: its own keys, wall_time last
    "schema_version": 1,
    "kind": "inprocess",
    "run_id": "r",
    "restart": 2,
    "cause": "exception",
    "rank": 0,
    "reason": "inprocess_exception",
    "message": "boom",
    "id": "r/0/1/0",
    "wall_time": "2026-12-06T03:00:01.000+00:00",
}
REPLACED: dict[str, object] = {
    "lost_rank": 2,
    "lost_pid": 7,
    "standby_pid": 9,
    "cause": "x",
    "fault_t": 1.5,
    "recovery_s": 0.6,
    "steps_redone": 0,
    "source": "replica on rank 0",
}
LIVE = {
    "standbys_per_node": 1,
    "waiting": 0,
    "left_unused": 0,
    "used": 1,
    "started": 1,
    "replaced": [REPLACED],
}


def test_restart_and_live_blocks_read_back_to_what_was_written() -> None:
    assert STATUS_BLOCKS["restarts"] is RestartsBlock and STATUS_BLOCKS["live"] is LiveBlock
    doc = StatusDoc.from_dict({"restarts": [PROCESS, INPROCESS, "junk"], "live": LIVE})
    restarts = doc.block(RestartsBlock)
    assert restarts is not None
    assert restarts.to_dict() == [PROCESS, INPROCESS]  # a line that is no entry is skipped
    assert [list(e) for e in restarts.to_dict()] == [list(PROCESS), list(INPROCESS)]
    first, second = restarts.entries
    assert (first.kind, first.exit_code, first.extra["rule"]) == ("process", -9, "transient")
    assert (second.kind, second.extra["id"]) == ("inprocess", "r/0/1/0")
    assert restarts.count("inprocess") == 1
    live = doc.block(LiveBlock)
    assert live is not None and live.to_dict() == LIVE
    assert live.replaced[0].standby_pid == 9
    assert live.replaced[0].source == "replica on rank 0"
    # a block written before the source was said (or with a value of the wrong type)
    # reads it as missing, and writes it back as null
    old = {k: v for k, v in REPLACED.items() if k != "source"}
    for raw in (old, {**old, "source": 3}):
        read = LiveBlock.from_dict({**LIVE, "replaced": [raw]})
        assert read is not None and read.replaced[0].source is None
        assert read.to_dict()["replaced"] == [{**old, "source": None}]


def test_a_restart_entry_of_wrong_types_reads_as_missing_and_is_stamped_last() -> None:
    entry = RestartEntry.from_dict({"kind": "inprocess", "rank": "1", "restart": True})
    assert entry is not None and entry.rank is None and entry.restart is None
    stamped = entry.stamped("2026-12-06T03:00:00.000+00:00")
    assert list(stamped.to_dict()) == ["kind", "rank", "restart", "wall_time"]
    assert RestartEntry.from_dict(3) is None and RestartsBlock.from_dict({}) is None
    made = RestartEntry(restart=1, extra={"decision": "restart"})
    assert list(made.to_dict())[-2:] == ["stack_dump", "decision"]


def test_a_restart_cause_keeps_its_decision_and_reads_bad_values_as_missing() -> None:
    cause = RestartCause.from_dict(
        {"finding_type": "worker_failed", "rank": 1, "pid": "x", "signal": "SIGKILL", "rule": "r"}
    )
    assert cause is not None
    assert (cause.rank, cause.pid, cause.signal) == (1, None, "SIGKILL")
    assert cause.decision == {"rule": "r"}
    assert RestartCause.from_dict(None) is None


_ROW: dict[str, Any] = {
    "rank": 2,
    "node_rank": 0,
    "hostname": "n0",
    "pid": 41,
    "gpu": {"token": "GPU-2"},
    "compute_ms": 20.0,
    "relative": 0.5,
    "individual": 1.0,
}

STRAGGLERS: dict[str, Any] = {  # as the straggler detector writes it
    "report": 3,
    "source": "own_compute",
    "ranks": 2,
    "best_compute_ms": 10.0,
    "stragglers": [2],
    "below_threshold": [2],
    "worst": [_ROW],
    "best": [{**_ROW, "rank": 0, "relative": 1.0}],
    "scores": {
        "0": {"relative": 1.0, "individual": 1.0},
        "2": {"relative": 0.5, "individual": None},
    },
}

PREEMPTION: dict[str, Any] = {  # as the preemption evaluator writes it, once preempted
    "budget": {
        "preempt_time_s": 60.0,
        "lead_s": 13.0,
        "save_s": 5.0,
        "save_source": "this run",
        "fits": True,
    },
    "signal": "SIGTERM",
    "reason": "preempted: node 0's launcher received SIGTERM",
    "stop_at_step": 75,
    "stop_at_script_step": 175,
    "preempt_time_s": 60.0,
    "terminated_pids": [],
    "saved_step": 175,
    "ranks_saved": 2,
    "saved": "every rank saved script step 175: the next run resumes there",
}


def test_straggler_and_preemption_blocks_read_back_to_what_was_written() -> None:
    for cls, raw in ((StragglersBlock, STRAGGLERS), (PreemptionBlock, PREEMPTION)):
        block = cls.from_dict(raw)
        assert block is not None
        assert list(block.to_dict().items()) == list(raw.items()), cls  # keys in order
    budget_only = {"budget": PREEMPTION["budget"]}
    block = PreemptionBlock.from_dict(budget_only)
    assert block is not None and not block.active and block.to_dict() == budget_only
    doc = StatusDoc.from_dict(
        {"stragglers": STRAGGLERS, "recent_findings": [], "preemption": PREEMPTION}
    )
    stragglers, pre = doc.block(StragglersBlock), doc.block(PreemptionBlock)
    assert stragglers is not None and stragglers.worst[0].rank == 2
    assert stragglers.scores["2"].individual is None
    assert pre is not None and pre.budget is not None and pre.budget.fits is True
    assert StatusDoc.from_dict({"stragglers": None}).block(StragglersBlock) is None


def test_straggler_and_preemption_blocks_read_wrong_types_as_missing() -> None:
    forged = StragglersBlock.from_dict(
        {
            "report": "3",
            "stragglers": [2, "x", True],
            "worst": [{"rank": "2", "relative": "0.5"}, 7],
            "scores": {"0": {"relative": True}, "1": "bad"},
        }
    )
    assert forged is not None and forged.report is None and forged.stragglers == [2]
    assert forged.worst == [StragglerRow()] and forged.scores == {"0": StragglerScores()}
    pre = PreemptionBlock.from_dict(
        {"budget": {"fits": "no", "save_s": "5"}, "reason": 1, "terminated_pids": [3, "4"]}
    )
    assert pre is not None and pre.active and pre.reason is None
    assert pre.budget == PreemptBudget() and pre.terminated_pids == (3,)


def test_the_live_block_says_a_shrink_only_once_there_was_one() -> None:
    shrunk = {
        "lost_rank": 1,
        "lost_pid": 101,
        "standby_pid": None,
        "cause": "rank_process_exited",
        "fault_t": 5.0,
        "recovery_s": 0.25,
        "steps_redone": 0,
        "source": None,  # nothing moved: the survivors went on with their own state
    }
    block = LiveBlock.from_dict({**LIVE, "shrunk": [shrunk], "world_size": 3})
    assert block is not None and block.world_size == 3
    assert block.to_dict() == {**LIVE, "shrunk": [shrunk], "world_size": 3}
    plain = LiveBlock.from_dict(LIVE)
    assert plain is not None and "shrunk" not in plain.to_dict()
