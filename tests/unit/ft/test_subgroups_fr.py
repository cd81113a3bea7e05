"""A 2x2 mesh's ranks as the flight recorder shows them: ``pg_status`` keyed by each
group's id on the rank (0 the world, 1 its data-parallel group, 2 its tensor-parallel
group: the order the rank created them in), the entries naming each group as every
rank does (data-parallel ``1`` = {0, 2}, ``2`` = {1, 3}; tensor-parallel ``3`` = {0, 1},
``4`` = {2, 3}). The sampler publishes positions under the groups' names, and the
traces' verdict compares a group's ranks with each other only."""

from __future__ import annotations

import json
from typing import Any

from rankguard.ft.collectives import CollectiveSampler
from rankguard.ft.frverdict import compare
from rankguard.monitor.hangclass import HangKind
from rankguard.schema.collectives import GroupPosition

_DESC = {0: "default_pg", 1: "mesh_dp", 2: "mesh_tp"}


def _names(rank: int) -> dict[int, str]:
    """The rank's group ids -> the groups' names."""
    return {0: "0", 1: "1" if rank % 2 == 0 else "2", 2: "3" if rank < 2 else "4"}


def _trace(rank: int, at: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """Rank ``rank``'s trace: group id -> (enqueued, completed); an all-reduce entry for
    each collective enqueued."""
    names = _names(rank)
    entries = [
        {
            "pg_id": pid,
            "process_group": [names[pid], _DESC[pid]],
            "collective_seq_id": s,
            "is_p2p": False,
            "profiling_name": "gloo:all_reduce",
            "input_sizes": [[4]],
        }
        for pid, (enq, _) in at.items()
        for s in range(max(1, enq - 2), enq + 1)
    ]
    status = {
        str(pid): {"last_enqueued_collective": str(e), "last_completed_collective": str(d)}
        for pid, (e, d) in at.items()
    }
    return {"version": "2.10", "pg_status": status, "entries": entries}


#: rank 1 stalled in compute before its tensor-parallel all-reduce #9 (by group id)
TP_STALL = {
    0: {0: (20, 20), 1: (8, 8), 2: (9, 8)},
    1: {0: (20, 20), 1: (8, 8), 2: (8, 8)},
    2: {0: (20, 20), 1: (9, 8), 2: (9, 9)},
    3: {0: (20, 20), 1: (9, 8), 2: (9, 9)},
}


def test_the_traces_name_the_rank_that_waits_on_no_one_in_a_group_it_belongs_to() -> None:
    """Rank 0 is behind in data-parallel group 1 but waits in its tensor-parallel
    all-reduce; ranks 2 and 3 never used tensor-parallel group 3 (not members): only
    rank 1 did not join, and the group named holds it."""
    v = compare({r: _trace(r, at) for r, at in TP_STALL.items()}, world=4)
    assert v is not None and v.kind is HangKind.DID_NOT_JOIN
    assert v.missing_ranks == [1], v.line
    # the first group by name it did not join: its data-parallel group (rank 3 waits)
    assert (v.process_group, v.seq, v.collective, v.waiting_ranks) == ("2", 9, "all_reduce", [3])


def test_a_rank_that_never_joins_a_data_parallel_all_reduce_is_named_alone() -> None:
    """Rank 1 never joins its data-parallel all-reduce #9 (rank 3 waits in it); ranks 0
    and 2 went on to the next step's world all-reduce #21, where rank 3 is behind while
    waiting in its own group."""
    at = {
        0: {0: (21, 20), 1: (9, 9), 2: (9, 9)},
        1: {0: (20, 20), 1: (8, 8), 2: (9, 9)},
        2: {0: (21, 20), 1: (9, 9), 2: (9, 9)},
        3: {0: (20, 20), 1: (9, 8), 2: (9, 9)},
    }
    v = compare({r: _trace(r, a) for r, a in at.items()}, world=4)
    assert v is not None and v.kind is HangKind.DID_NOT_JOIN
    assert v.missing_ranks == [1], v.line


def test_the_sampler_publishes_each_position_under_its_groups_name() -> None:
    """Rank 1's status says group ids 1 and 2; its entries name them 2 and 3: the block
    carries groups 2 and 3 (one full dump to learn the names, none after)."""
    trace = _trace(1, TP_STALL[1])
    dumps = {"n": 0}

    def entries() -> bytes:
        dumps["n"] += 1
        return json.dumps({"entries": trace["entries"]}).encode()

    status = json.dumps({"pg_status": trace["pg_status"]}).encode()
    sampler = CollectiveSampler(status=lambda: status, entries=entries)
    for _ in range(3):
        sampler.sample()
    block = sampler.block()
    assert block is not None
    assert block.groups == (
        GroupPosition("0", 20, 20),
        GroupPosition("2", 8, 8),
        GroupPosition("3", 8, 8),
    )
    assert dumps["n"] == 1 and sampler.name_dumps == 1
