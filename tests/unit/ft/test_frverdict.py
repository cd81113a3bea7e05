"""The flight-recorder verdict's kinds from traces built as the ranks of two nodes send
them (keyed by the job's rank numbers): a rank that did not join, a rank waiting in an
earlier collective (not a culprit), a mismatch, a communication stall."""

from __future__ import annotations

from typing import Any

from rankguard.ft.frverdict import FrVerdict, compare
from rankguard.monitor.hangclass import HangKind


def _trace(enq: int, done: int, ops: dict[int, str] | None = None) -> dict[str, Any]:
    """A rank's trace: group 0 at (enqueued, completed); ``ops`` names collectives by
    number (``all_reduce [[4]]``: operation and input sizes), all_reduce [[4]] else."""
    ops = ops or {}
    entries = []
    for s in range(1, enq + 1):
        op, _, sizes = ops.get(s, "all_reduce [[4]]").partition(" ")
        entries.append(
            {
                "process_group": ["0", "default_pg"],
                "collective_seq_id": s,
                "is_p2p": False,
                "profiling_name": f"gloo:{op}",
                "input_sizes": [[int(sizes.strip("[]"))]],
            }
        )
    status = {"last_enqueued_collective": str(enq), "last_completed_collective": str(done)}
    return {"version": "2.10", "pg_status": {"0": status}, "entries": entries}


def test_a_rank_in_an_earlier_broadcast_waits_and_only_the_one_that_did_not_join_is_named() -> None:
    """2x2: rank 3 stalled before DDP's buffer broadcast #17; gloo's broadcast completed
    on ranks 0 and 2 (they wait in the all-reduce #18), rank 1 waits in the broadcast."""
    bcast = {17: "broadcast [[4]]"}
    v = compare(
        {
            0: _trace(18, 17, bcast),
            1: _trace(17, 16, bcast),
            2: _trace(18, 17, bcast),
            3: _trace(16, 16),
        }
    )
    assert v is not None and v.kind is HangKind.DID_NOT_JOIN
    assert (v.missing_ranks, v.collective, v.seq) == ([3], "broadcast", 17)
    assert (v.waiting_ranks, v.later_ranks, v.ranks_read) == ([0, 1, 2], [0, 2], [0, 1, 2, 3])
    assert v.line == (
        "flight recorder: rank(s) 3 did not join broadcast #17 of process group 0 "
        "(rank(s) 1 wait in it, rank(s) 0, 2 in a later collective of the group)"
    )
    assert FrVerdict.from_dict(v.to_dict()) == v


def test_ranks_inside_different_collectives_at_one_number_are_a_mismatch() -> None:
    other = {9: "all_gather [[8]]"}
    traces = {0: _trace(9, 8), 1: _trace(9, 8), 2: _trace(9, 8, other), 3: _trace(9, 8, other)}
    v = compare(traces, world=4)
    assert v is not None and v.kind is HangKind.MISMATCH
    assert v.sides == {"all_reduce [[4]]": [0, 1], "all_gather [[8]]": [2, 3]}
    assert v.line == (
        "flight recorder: mismatch at #9 of process group 0: rank(s) 0, 1 in all_reduce "
        "[[4]]; rank(s) 2, 3 in all_gather [[8]]"
    )
    assert FrVerdict.from_dict(v.to_dict()) == v


def test_every_rank_inside_the_same_collective_is_a_communication_stall() -> None:
    v = compare({r: _trace(9, 8) for r in range(4)}, world=4)
    assert v is not None and v.kind is HangKind.COMMUNICATION_STALL
    assert (v.waiting_ranks, v.collective, v.seq) == ([0, 1, 2, 3], "all_reduce", 9)
    assert v.line == (
        "flight recorder: communication stall: rank(s) 0, 1, 2, 3 all joined all_reduce #9 "
        "of process group 0 and none completes it"
    )


def test_no_rank_inside_a_collective_gives_no_verdict() -> None:
    assert compare({r: _trace(9, 9) for r in range(4)}, world=4) is None


def test_no_stall_is_said_while_a_rank_of_the_job_was_not_read() -> None:
    """Rank 3 stopped (not asked) or its node silent: the three read all wait in #9, but
    rank 3 may never have joined it."""
    assert compare({r: _trace(9, 8) for r in range(3)}, world=4) is None


def test_a_rank_that_did_not_join_with_no_rank_waiting_says_no_empty_list() -> None:
    """The other ranks are outside the group's collectives (re-entering in-process, say):
    the line names the rank and the collective, and no 'rank(s) none wait in it'."""
    verdict = FrVerdict(
        process_group="0",
        collective="broadcast",
        seq=16,
        missing_ranks=[1],
        waiting_ranks=[],
        ranks_read=[0, 1, 2, 3],
    )
    assert (
        verdict.line == "flight recorder: rank(s) 1 did not join broadcast #16 of process group 0"
    )


def test_a_stage_waiting_in_a_point_to_point_receive_is_not_named_as_not_joining() -> None:
    """A 4-stage pipeline on gloo (no send or receive in the traces): stage 1 stalled in
    its backward, stage 0 waits in a receive of its gradients (by its heartbeat), stage
    3 waits in the next step's all-reduce #97, stage 2 in a later one. Stages 0 and 1
    are both behind; only stage 1 waits on no one."""
    traces = {0: _trace(96, 96), 1: _trace(96, 96), 2: _trace(97, 96), 3: _trace(97, 96)}
    assert compare(traces).missing_ranks == [0, 1]  # type: ignore[union-attr]
    v = compare(traces, waiting=[0])
    assert v is not None and v.kind is HangKind.DID_NOT_JOIN
    assert (v.missing_ranks, v.seq, v.waiting_ranks) == ([1], 97, [2, 3])
