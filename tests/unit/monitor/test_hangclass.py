"""The kind of a hang from the ranks' places in their collectives: who did not join,
a mismatch (both sides), a communication stall, a compute hang; and the finding that
names it, with the job's rank numbers whichever node the ranks run on. A rank that
stopped publishing is compared by its last record, and its heartbeat timeout carries the
class where that record says one."""

from __future__ import annotations

from typing import Any

from rankguard.monitor.hangclass import HangKind, classify, classify_silent, frame_op
from rankguard.schema.collectives import CollectivesBlock, GroupPosition, StuckCollective
from tests.factories import Feed, types_of
from tests.factories import heartbeat_rules as _rules


def _block(enq: int, done: int, op: str | None = None, sizes: str = "[[4]]") -> CollectivesBlock:
    stuck = StuckCollective("0", enq, op, sizes) if op and enq > done else None
    return CollectivesBlock(groups=(GroupPosition("0", enq, done),), samples=9, stuck=stuck)


def test_a_rank_that_did_not_join_is_named_with_the_collective_and_its_number() -> None:
    got = classify(
        {0: _block(13, 12, "all_reduce"), 1: _block(13, 12), 2: _block(13, 12), 3: _block(12, 12)}
    )
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert (got.group, got.seq, got.op, got.missing, got.waiting) == (
        "0",
        13,
        "all_reduce",
        [3],
        [0, 1, 2],
    )
    assert got.line == (
        "collectives: rank(s) 3 did not join all_reduce #13 of process group 0 "
        "(rank(s) 0, 1, 2 wait in it)"
    )


def test_a_rank_waiting_in_an_earlier_collective_is_not_one_that_did_not_join() -> None:
    """A 2x2 job, rank 3 (node 1's local rank 1) stalled before DDP's buffer broadcast
    #17: gloo's broadcast from rank 0 completes on ranks 0 and 2 without rank 3, so they
    go on to the gradients' all-reduce #18; rank 1 waits in the broadcast. Only rank 3
    did not join: the first collective it did not join is #17, the broadcast."""
    got = classify(
        {
            0: _block(18, 16, "all_reduce"),
            1: _block(17, 16, "broadcast"),
            2: _block(18, 17, "all_reduce"),
            3: _block(16, 16),
        }
    )
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert (got.missing, got.seq, got.op) == ([3], 17, "broadcast")
    assert (got.waiting, got.later) == ([0, 1, 2], [0, 2])
    assert got.line == (
        "collectives: rank(s) 3 did not join broadcast #17 of process group 0 "
        "(rank(s) 1 wait in it, rank(s) 0, 2 in a later collective of the group)"
    )


def test_ranks_in_different_collectives_at_one_number_are_a_mismatch() -> None:
    got = classify(
        {
            0: _block(7, 6, "all_reduce", "[[4]]"),
            1: _block(7, 6, "all_reduce", "[[4]]"),
            2: _block(7, 6, "all_gather", "[[8]]"),
        }
    )
    assert got is not None and got.kind is HangKind.MISMATCH
    assert got.sides == {"all_reduce [[4]]": [0, 1], "all_gather [[8]]": [2]}
    assert "rank(s) 0, 1 in all_reduce [[4]]; rank(s) 2 in all_gather [[8]]" in got.line


def test_every_rank_inside_the_same_collective_is_a_communication_stall() -> None:
    got = classify({r: _block(9, 8, "all_reduce") for r in range(4)})
    assert got is not None and got.kind is HangKind.COMMUNICATION_STALL
    assert got.waiting == [0, 1, 2, 3] and got.seq == 9
    assert "none completes it" in got.line


def test_no_rank_inside_a_collective_is_a_compute_hang() -> None:
    got = classify({0: _block(5, 5), 1: _block(5, 5)})
    assert got is not None and got.kind is HangKind.COMPUTE_HANG


def test_a_rank_without_a_block_leaves_the_hang_unclassified() -> None:
    assert classify({0: _block(5, 4), 1: None}) is None


def _at(enq: int, done: int, op: str | None = None) -> dict[str, Any]:
    return _block(enq, done, op).to_dict()


def test_the_hang_finding_names_the_kind_with_the_jobs_rank_numbers() -> None:
    """Four ranks on two nodes (two each): rank 3, node 1's second rank, skipped the
    all-reduce; the finding says rank 3, not its local rank 1."""
    rules = _rules(world=4)
    feed = Feed(rules)
    found = []
    for t in range(0, 30):
        for rank in range(4):
            feed.beat(
                rank,
                float(t),
                world_size=4,
                node_rank=rank // 2,
                ranks_per_node=2,
                progress_seq=6,
                since=float(t) + (rank != 3),
                collectives=_at(13, 12, "all_reduce") if rank != 3 else _at(12, 12),
            )
        found += rules.evaluate(t + 0.1)
    assert types_of(found) == [(3, "gpu_progress_timeout")]
    hang = found[0].detail["hang"]
    assert hang["kind"] == "did_not_join" and hang["missing_ranks"] == [3], hang
    assert hang["op"] == "all_reduce" and hang["seq"] == 13
    assert "rank(s) 3 did not join all_reduce #13 of process group 0" in found[0].message


def test_a_rank_waiting_in_an_earlier_collective_gets_no_finding_of_its_own() -> None:
    """The 2x2 job where gloo's broadcast #17 completed on ranks 0 and 2 without rank 3:
    rank 1, inside the broadcast, waits for rank 3 like ranks 0 and 2 in #18; rank 3
    alone is the hang's culprit, named once."""
    at = {0: _at(18, 16, "all_reduce"), 1: _at(17, 16, "broadcast"), 2: _at(18, 17, "all_reduce")}
    rules = _rules(world=4)
    feed = Feed(rules)
    found = []
    for t in range(0, 30):
        for rank in range(4):
            feed.beat(
                rank,
                float(t),
                world_size=4,
                node_rank=rank // 2,
                ranks_per_node=2,
                progress_seq=6,
                since=float(t) + (rank != 3),
                collectives=at.get(rank, _at(16, 16)),
            )
        found += rules.evaluate(t + 0.1)
    assert types_of(found) == [(3, "gpu_progress_timeout")]
    hang = found[0].detail["hang"]
    assert (hang["missing_ranks"], hang["seq"], hang["op"]) == ([3], 17, "broadcast"), hang
    assert "rank(s) 3 did not join broadcast #17 of process group 0" in found[0].message


def test_a_main_frame_inside_a_collective_call_names_its_operation() -> None:
    assert frame_op("distributed_c10d.py:3155 in all_reduce") == "all_reduce"
    assert frame_op("distributed_c10d.py:99 in new_group") is None
    assert frame_op("graph.py:979 in _engine_run_backward") is None
    assert frame_op("train.py:12 in all_reduce") is None
    assert frame_op(None) is None


def test_a_rank_stopped_inside_a_collective_every_rank_joined_is_a_communication_stall() -> None:
    """Rank 1 stopped 1.5 s into all-reduce #10 (before its ``stuck`` was taken), rank 0
    joined it after: every rank inside #10, none completes; the operation from rank 1's
    main frame."""
    got = classify_silent({0: _block(10, 9), 1: _block(10, 9)}, [1], {1: "all_reduce"})
    assert got is not None and got.kind is HangKind.COMMUNICATION_STALL
    assert (got.group, got.seq, got.op, got.waiting, got.silent) == (
        "0",
        10,
        "all_reduce",
        [0, 1],
        [1],
    )
    assert got.line == (
        "collectives: communication stall: rank(s) 1 stopped publishing inside all_reduce "
        "#10 of process group 0, which rank(s) 0, 1 all joined; none completes it"
    )
    assert got.to_dict()["silent_ranks"] == [1]


def test_a_rank_stopped_outside_while_its_peers_wait_did_not_join() -> None:
    got = classify_silent({0: _block(10, 9, "all_reduce"), 1: _block(9, 9)}, [1])
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert (got.missing, got.seq, got.op, got.silent) == ([1], 10, "all_reduce", [1])
    assert got.line.endswith("(rank(s) 0 wait in it); rank(s) 1 stopped publishing")


def test_a_rank_stopped_before_its_peers_joined_or_outside_any_collective_has_no_class() -> None:
    """Inside #10 before its peers reached it (they may still come: they are not the
    ones that did not join), or every rank outside any collective (its peers work on):
    nothing said about a hang."""
    assert classify_silent({0: _block(9, 9), 1: _block(10, 9)}, [1], {1: "all_reduce"}) is None
    assert classify_silent({0: _block(9, 9), 1: _block(9, 9)}, [1]) is None
    assert classify({0: _block(9, 9), 1: _block(9, 9)}) is not None  # (a compute hang)


def _stop_run(rank1_at: dict[str, Any], rank0_at: dict[str, Any]) -> list[Any]:
    """Two ranks; rank 1's last record at t=5 (``rank1_at``), rank 0 publishing on at
    the same step with ``rank0_at`` from t=6; rules evaluated every second to t=20."""
    rules = _rules(world=2)
    feed = Feed(rules)
    found = []
    for t in range(0, 21):
        for rank in (0, 1):
            if rank == 1 and t > 5:
                continue
            before = {"block": _at(9, 9), "kw": {}}
            at = rank1_at if rank == 1 else (rank0_at if t >= 6 else before)
            feed.beat(
                rank, float(t), progress_seq=9, since=5.0, collectives=at["block"], **at["kw"]
            )
        found += rules.evaluate(t + 0.1)
    return found


def test_the_heartbeat_timeout_of_a_rank_stopped_inside_a_collective_carries_the_stall() -> None:
    inside = {"block": _at(10, 9), "kw": {"main_frame": "distributed_c10d.py:3155 in all_reduce"}}
    found = _stop_run(inside, {"block": _at(10, 9), "kw": {}})
    assert types_of(found) == [(1, "rank_process_heartbeat_timeout")]
    hang = found[0].detail["hang"]
    assert hang["kind"] == "communication_stall", hang
    assert (hang["seq"], hang["op"], hang["silent_ranks"], hang["waiting_ranks"]) == (
        10,
        "all_reduce",
        [1],
        [0, 1],
    )
    assert "rank(s) 1 stopped publishing inside all_reduce #10 of process group 0" in (
        found[0].message
    )


def test_the_heartbeat_timeout_of_a_rank_stopped_outside_any_collective_has_no_class() -> None:
    """Rank 1 stopped in its own work; rank 0 progresses on (its own work, no collective
    waited in yet): no class on the heartbeat timeout."""
    outside = {"block": _at(9, 9), "kw": {"main_frame": "train.py:40 in forward"}}
    found = _stop_run(outside, {"block": _at(9, 9), "kw": {}})
    assert types_of(found) == [(1, "rank_process_heartbeat_timeout")]
    assert "hang" not in found[0].detail
    assert "collectives:" not in found[0].message
