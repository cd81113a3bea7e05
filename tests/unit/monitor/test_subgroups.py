"""Hangs in process groups other than the default, on a 2x2 mesh (data-parallel x
tensor-parallel): the rank that waits on no one is named, with the group it did not
join; ranks waiting in either group are victims.

The mesh of these tests, by group name (the same on every rank): ``0`` the world,
``1`` = data-parallel {0, 2}, ``2`` = data-parallel {1, 3}, ``3`` = tensor-parallel
{0, 1}, ``4`` = tensor-parallel {2, 3}; each step starts with an all-reduce of the
world group, then the tensor-parallel all-reduce (forward), then the data-parallel one
(the gradients)."""

from __future__ import annotations

from typing import Any

from rankguard.monitor.hangclass import HangKind, classify
from rankguard.schema.collectives import CollectivesBlock, GroupPosition
from tests.factories import Feed, types_of
from tests.factories import heartbeat_rules as _rules

Places = dict[int, dict[str, tuple[int, int]]]

#: rank 1 stalled in compute before its tensor-parallel all-reduce #9: rank 0 waits in
#: it; ranks 2 and 3 completed theirs and wait in their data-parallel all-reduce #9 (for
#: rank 0, for rank 1). Every rank completed the same steps.
TP_STALL: Places = {
    0: {"0": (20, 20), "1": (8, 8), "3": (9, 8)},
    1: {"0": (20, 20), "2": (8, 8), "3": (8, 8)},
    2: {"0": (20, 20), "1": (9, 8), "4": (9, 9)},
    3: {"0": (20, 20), "2": (9, 8), "4": (9, 9)},
}

#: rank 1 never joins its data-parallel all-reduce #9: rank 3 waits in it; ranks 0 and 2
#: completed theirs, finished the step and wait in the next step's world all-reduce #21
#: (rank 3 is behind there, but waits in its data-parallel group: a victim).
DP_STALL: Places = {
    0: {"0": (21, 20), "1": (9, 9), "3": (9, 9)},
    1: {"0": (20, 20), "2": (8, 8), "3": (9, 9)},
    2: {"0": (21, 20), "1": (9, 9), "4": (9, 9)},
    3: {"0": (20, 20), "2": (9, 8), "4": (9, 9)},
}


def _block(places: dict[str, tuple[int, int]]) -> CollectivesBlock:
    return CollectivesBlock(groups=tuple(GroupPosition(g, e, d) for g, (e, d) in places.items()))


def _as_record(places: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {"groups": {g: [e, d] for g, (e, d) in places.items()}, "samples": 10, "waiting": 5}


def test_a_rank_stalled_before_a_tensor_parallel_all_reduce_is_named_in_both_its_groups() -> None:
    """Rank 0 is behind in data-parallel group 1 (rank 2 waits there at #9) but inside
    its tensor-parallel all-reduce: it waits on rank 1, it did not fail to join. Rank 1
    is behind in both its groups, each with a peer waiting: both are said."""
    got = classify({r: _block(p) for r, p in TP_STALL.items()})
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert (got.missing, got.group, got.seq, got.waiting) == ([1], "2", 9, [3])
    assert got.also == [("3", 9)]
    assert got.line == (
        "collectives: rank(s) 1 did not join collective #9 of process group 2 "
        "(rank(s) 3 wait in it), nor #9 of process group 3"
    )


def test_a_rank_that_never_joins_a_data_parallel_all_reduce_is_named_alone() -> None:
    """Rank 3 is behind in the world group (ranks 0 and 2 wait in #21) but inside its
    data-parallel all-reduce, waiting on rank 1: only rank 1 did not join."""
    got = classify({r: _block(p) for r, p in DP_STALL.items()})
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert got.missing == [1], got


def _run(places: Places, progress: dict[int, int]) -> tuple[list[tuple[int, str]], Any]:
    rules = _rules(world=4)
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    hang = None
    for t in range(0, 30):
        for rank, at in places.items():
            # the victims' records are older: they would cross the timeout first
            feed.beat(
                rank,
                float(t),
                progress_seq=progress[rank],
                since=float(t) + (rank != 1),
                main_frame="model.py:10 in forward",
                collectives=_as_record(at),
            )
        out = rules.evaluate(t + 0.1)
        found += types_of(out)
        hang = hang or next((f.detail["hang"] for f in out if "hang" in f.detail), None)
    return found, hang


def test_the_tensor_parallel_culprit_alone_is_named_and_its_finding_names_the_group() -> None:
    found, hang = _run(TP_STALL, {r: 12 for r in range(4)})
    assert found == [(1, "gpu_progress_timeout")]
    assert hang is not None and hang["kind"] == "did_not_join", hang
    assert (hang["missing_ranks"], hang["group"], hang["seq"]) == ([1], "2", 9), hang
    assert hang["also"] == [{"group": "3", "seq": 9}], hang


def test_the_data_parallel_culprit_alone_is_named_and_its_victims_are_not() -> None:
    """Ranks 0 and 2 finished step 13; ranks 1 and 3 did not (rank 3 waits on rank 1)."""
    found, hang = _run(DP_STALL, {0: 13, 1: 12, 2: 13, 3: 12})
    assert found == [(1, "gpu_progress_timeout")]
    assert hang is not None and hang["missing_ranks"] == [1], hang


def test_a_victim_behind_in_the_world_group_but_waiting_in_its_own_is_not_named() -> None:
    """The step ends with a world all-reduce (a loss reduced for the log) before its
    progress is counted, so every rank is at the same step: ranks 0 and 2 wait in the
    world's #21, ranks 1 and 3 are behind there, rank 3 inside its data-parallel
    all-reduce (waiting on rank 1). Rank 1 alone is behind and inside nothing."""
    found, hang = _run(DP_STALL, {r: 12 for r in range(4)})
    assert found == [(1, "gpu_progress_timeout")]
    assert hang is not None and hang["missing_ranks"] == [1], hang
