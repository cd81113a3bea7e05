"""Hangs of a pipeline: stages waiting for each other in point-to-point operations.

torch 2.13's flight recorder does not record gloo's sends and receives, so every rank's
``collectives`` block says "inside nothing" (the world group's last all-reduce
completed), and a stage waiting in ``dist.irecv(...).wait()`` or ``batch_isend_irecv``'s
requests has a main frame in its caller (``Work.wait`` is native): its heartbeat's
``main_call`` (``wait``) is what says it waits. The stage waiting on no one is named.
"""

from __future__ import annotations

from typing import Any

from rankguard.monitor.hangclass import HangKind, classify, classify_silent
from rankguard.schema.collectives import CollectivesBlock, GroupPosition
from tests.factories import Feed, types_of
from tests.factories import heartbeat_rules as _rules

#: every stage completed the world's all-reduce #20 of this step (the loop's stop flag)
_WORLD = {"groups": {"0": [20, 20]}, "samples": 10, "waiting": 5}

#: stage 1 of 4 sleeps in its forward; stages 0, 2, 3 wait on a request (a recv of
#: activations from stage 1, or of gradients from the stage after)
_STAGE1_STALLED = {
    0: ("pipeline.py:40 in step", "wait"),
    1: ("pipeline.py:12 in pause", "sleep"),
    2: ("pipeline.py:31 in _recv", "wait"),
    3: ("pipeline.py:31 in _recv", "wait"),
}


def _run(places: dict[int, tuple[str, str | None]]) -> tuple[list[tuple[int, str]], Any]:
    rules = _rules(world=len(places))
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    hang = None
    for t in range(0, 30):
        for rank, (frame, call) in places.items():
            extra: dict[str, Any] = {"main_call": call} if call is not None else {}
            # the victims' records are older: they would cross the timeout first
            feed.beat(
                rank,
                float(t),
                progress_seq=12,
                since=float(t) + (rank != 1),
                main_frame=frame,
                collectives=_WORLD,
                **extra,
            )
        out = rules.evaluate(t + 0.1)
        found += types_of(out)
        hang = hang or next((f.detail["hang"] for f in out if "hang" in f.detail), None)
    return found, hang


def test_the_stalled_stage_alone_is_named_not_the_stages_waiting_on_its_requests() -> None:
    found, hang = _run(_STAGE1_STALLED)
    assert found == [(1, "gpu_progress_timeout")]
    assert hang is not None and hang["kind"] == "point_to_point", hang
    assert (hang["missing_ranks"], hang["waiting_ranks"]) == ([1], [0, 2, 3]), hang
    assert hang["line"] == (
        "collectives: rank(s) 1 in no wait; rank(s) 0, 2, 3 wait in point-to-point operations"
    )


def test_stages_in_a_blocking_recv_are_waiting_too_and_the_hang_is_point_to_point() -> None:
    found, hang = _run(
        {
            0: ("distributed_c10d.py:2799 in recv", None),
            1: ("pipeline.py:12 in pause", "sleep"),
        }
    )
    assert found == [(1, "gpu_progress_timeout")]
    assert hang is not None and hang["kind"] == "point_to_point", hang
    assert hang["missing_ranks"] == [1], hang


def test_a_wait_that_is_not_native_does_not_make_a_rank_a_victim() -> None:
    """Every stage in its own code (a Python ``threading.Event.wait`` has a frame of its
    own; its native call is ``acquire``): none told apart, all named, a compute hang."""
    found, hang = _run(
        {
            0: ("threading.py:327 in wait", "acquire"),
            1: ("pipeline.py:12 in pause", "sleep"),
        }
    )
    assert sorted(found) == [(0, "gpu_progress_timeout"), (1, "gpu_progress_timeout")]
    assert hang is not None and hang["kind"] == "compute_hang", hang


def _idle() -> CollectivesBlock:
    return CollectivesBlock(groups=(GroupPosition("0", 20, 20),))


def test_every_stage_waiting_is_a_point_to_point_hang_with_no_one_outside() -> None:
    got = classify({0: _idle(), 1: _idle()}, p2p=[0, 1])
    assert got is not None and got.kind is HangKind.POINT_TO_POINT
    assert (got.missing, got.waiting) == ([], [0, 1])
    assert "every rank" in got.line


def test_a_collective_the_recorder_shows_comes_before_point_to_point_waits() -> None:
    """Rank 0 waits in the world's all-reduce #21 that rank 1 never joined; rank 2
    waits in a receive: the hang is rank 1's, in the world group."""
    blocks = {
        0: CollectivesBlock(groups=(GroupPosition("0", 21, 20),)),
        1: _idle(),
        2: _idle(),
    }
    got = classify(blocks, p2p=[2])
    assert got is not None and got.kind is HangKind.DID_NOT_JOIN
    assert got.missing == [1]


def test_a_silent_stage_outside_any_wait_keeps_the_point_to_point_class() -> None:
    blocks = {0: _idle(), 1: _idle(), 2: _idle()}
    got = classify_silent(blocks, [1], p2p=[0, 2])
    assert got is not None and got.kind is HangKind.POINT_TO_POINT
    assert (got.missing, got.silent) == ([1], [1])
    # a silent stage that was itself waiting says nothing yet: its peer may come
    assert classify_silent(blocks, [0], p2p=[0, 2]) is None
