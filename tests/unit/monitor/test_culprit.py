"""Culprit attribution when the culprit's records arrive later than its victims'
(a rank on another node, relayed through the store)."""

from __future__ import annotations

from tests.factories import Feed, types_of
from tests.factories import heartbeat_rules as _rules


def test_stalled_rank_ahead_of_a_live_rank_waits_for_it() -> None:
    """Rank 1 (local) stalls at step 5 waiting for rank 3 (remote, stuck at 4), and rank
    1 crosses the progress timeout first because rank 3's view is older: rank 1 must
    not be reported; rank 3 is, once its own timeout passes."""
    rules = _rules(world=4)
    feed = Feed(rules)
    for t in range(0, 24):
        now = float(t)
        for rank in (0, 1):  # victims: finished step 5 at t=0, now blocked
            feed.beat(rank, now, progress_seq=5, since=now)
        for rank in (2,):  # another victim, same node as the culprit
            feed.beat(rank, now, progress_seq=5, since=now)
        # culprit: stuck at step 4 since t=-0.5, but its records lag 1.5 s behind
        if t >= 2:
            feed.beat(3, now - 1.5, progress_seq=4, since=now - 1.5 + 0.5)
        found = rules.evaluate(now)
        if t < 20:
            assert found == [], (t, types_of(found))
        assert all(f.rank == 3 for f in found)
        if 1 in rules.ranks and rules.ranks[1].stall is not None:
            assert rules.ranks[1].blocked_by == [3]
    assert (3, "gpu_progress_timeout") in [
        (r, "gpu_progress_timeout")
        for r, s in rules.ranks.items()
        if "gpu_progress_timeout" in s.active
    ]
    assert not rules.ranks[1].active and not rules.ranks[0].active


def test_relayed_age_makes_remote_records_age_from_their_creation() -> None:
    rules = _rules(world=1)
    record = {
        "schema_version": 1,
        "run_id": "run-1",
        "rank": 0,
        "pid": 7,
        "seq": 3,
        "event": "heartbeat",
        "hostname": "remote",
        "progress_seq": 2,
        "since_progress_s": 1.0,
        "checkpoint_active": False,
        "wall_time_ns": 1,
    }
    # the monitor received it at t=100 but it was 2.5 s old (relayed_age_s)
    rules.ingest(record, 100.0 - 2.5)
    rules.evaluate(101.0)
    assert rules.ranks[0].heartbeat_age_s == 3.5
    assert rules.ranks[0].progress_age_s == 4.5


def test_a_rank_outside_the_collective_is_the_culprit_of_those_waiting_in_it() -> None:
    # All at step 5: ranks 0 and 2 wait inside all_reduce, rank 1 sleeps before it.
    rules = _rules(world=3)
    feed = Feed(rules)
    frames = {
        0: "distributed_c10d.py:2810 in all_reduce",
        1: "train.py:40 in step",
        2: "c10d_logger.py:81 in wrapper",
    }
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank, frame in frames.items():
            feed.beat(rank, float(t), progress_seq=5, since=float(t), main_frame=frame)
        found += types_of(rules.evaluate(t + 0.1))
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1] and rules.ranks[2].blocked_by == [1]


def test_a_rank_missing_from_ddps_first_collective_is_the_culprit_in_setup() -> None:
    # Before the first step: rank 0 waits in DistributedDataParallel's constructor (its
    # parameter-shape check across the ranks), rank 1 never got there (stalled).
    rules = _rules(world=2)
    feed = Feed(rules)
    frames = {
        0: "utils.py:286 in _verify_param_shape_across_processes",
        1: "simulate.py:36 in _stall",
    }
    found: list[tuple[int, str]] = []
    for t in range(0, 90):
        for rank, frame in frames.items():
            feed.beat(rank, float(t), progress_seq=0, since=float(t), main_frame=frame)
        found += types_of(rules.evaluate(t + 0.1))
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1]


def test_all_waiting_in_the_collective_are_all_reported() -> None:
    rules = _rules(world=2)
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank in (0, 1):
            frame = "distributed_c10d.py:2810 in all_reduce"
            feed.beat(rank, float(t), progress_seq=5, since=float(t), main_frame=frame)
        found += types_of(rules.evaluate(t + 0.1))
    assert sorted(found) == [(0, "gpu_progress_timeout"), (1, "gpu_progress_timeout")]


def test_a_rank_waiting_in_ddps_backward_all_reduce_is_not_the_culprit() -> None:
    """DistributedDataParallel's gradient all-reduce waits in C++ under autograd: the
    rank waiting for its peer sits in ``_engine_run_backward``, the culprit sleeps in its
    own step. Only the culprit is named (both used to be, whichever crossed first)."""
    rules = _rules(world=3)
    feed = Feed(rules)
    frames = {
        0: "graph.py:979 in _engine_run_backward",
        1: "megatron_ft.py:88 in <module>",
        2: "graph.py:979 in _engine_run_backward",
    }
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank, frame in frames.items():
            # the waiting ranks' records are older: they would cross the timeout first
            feed.beat(
                rank, float(t), progress_seq=12, since=float(t) + (rank != 1), main_frame=frame
            )
        found += types_of(rules.evaluate(t + 0.1))
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1] and rules.ranks[2].blocked_by == [1]


def test_collective_frames_of_ddp_and_fsdp_wait_for_peers() -> None:
    from rankguard.schema.frames import waits_in_collective

    waiting = [
        "distributed_c10d.py:2810 in all_reduce",
        "c10d_logger.py:81 in wrapper",
        "graph.py:966 in _engine_run_backward",
        "utils.py:286 in _verify_param_shape_across_processes",
        "distributed.py:2360 in _distributed_broadcast_coalesced",
        "_fsdp_collectives.py:449 in foreach_all_gather_copy_out",
    ]
    working = [
        "train.py:40 in step",
        "graph.py:12 in forward",  # a user's graph.py
        "utils.py:3 in _sync_module_states_of_mine",
        "distributed.py:2405 in _sync_buffers_x",
        "",
    ]
    assert all(waits_in_collective(f) for f in waiting)
    assert not any(waits_in_collective(f) for f in working) and not waits_in_collective(None)


def _at(enqueued: int, completed: int) -> dict[str, object]:
    """A rank's ``collectives`` block: its place in the default group."""
    return {"groups": {"0": [enqueued, completed]}, "samples": 10, "waiting": 0}


def test_the_rank_behind_in_the_collectives_is_the_culprit_whatever_the_frames() -> None:
    """No Python frame tells them apart (a direct ``ProcessGroup`` call, a wait in C++):
    ranks 0 and 2 entered all-reduce #13 and wait in it, rank 1 completed #12 and never
    entered #13. The flight recorder's positions name rank 1 alone."""
    rules = _rules(world=3)
    feed = Feed(rules)
    at = {0: _at(13, 12), 1: _at(12, 12), 2: _at(13, 12)}
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank, block in at.items():
            # the waiting ranks' records are older: they would cross the timeout first
            feed.beat(
                rank,
                float(t),
                progress_seq=12,
                since=float(t) + (rank != 1),
                main_frame="train.py:40 in step",
                collectives=block,
            )
        found += types_of(rules.evaluate(t + 0.1))
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1] and rules.ranks[2].blocked_by == [1]


def test_a_rank_inside_a_collective_by_the_recorder_waits_for_one_outside() -> None:
    """Same position, but rank 0 is inside the collective (enqueued, not completed) with
    an unrecognised frame; rank 1 is outside: rank 1 is the culprit."""
    rules = _rules(world=2)
    feed = Feed(rules)
    at = {0: _at(7, 6), 1: _at(6, 6)}
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank, block in at.items():
            feed.beat(
                rank,
                float(t),
                progress_seq=5,
                since=float(t) + (rank == 0),
                main_frame="model.py:10 in forward",
                collectives=block,
            )
        found += types_of(rules.evaluate(t + 0.1))
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1]


def test_every_rank_inside_the_same_collective_is_reported() -> None:
    """Every rank joined and none completes (a communication stall): no rank is behind,
    so each is reported."""
    rules = _rules(world=2)
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    for t in range(0, 30):
        for rank in (0, 1):
            feed.beat(rank, float(t), progress_seq=5, since=float(t), collectives=_at(9, 8))
        found += types_of(rules.evaluate(t + 0.1))
    assert sorted(found) == [(0, "gpu_progress_timeout"), (1, "gpu_progress_timeout")]


def test_a_ranks_place_and_phase_follow_its_latest_record() -> None:
    """Whether a rank waits inside a collective and whether it is in a phase of its own
    are worked out once per record: each new record of the rank is read anew."""
    from rankguard.monitor.verdicts.evidence import busy, in_collective

    rules = _rules(world=1)
    feed = Feed(rules)
    places = [
        ("distributed_c10d.py:2810 in all_reduce", "train", True, False),
        ("train.py:40 in step", "eval", False, True),
        ("c10d_logger.py:81 in wrapper", "train", True, False),
        ("train.py:40 in step", "train", False, False),
    ]
    for t, (frame, phase, inside, own) in enumerate(places):
        feed.beat(0, float(t), progress_seq=5, since=0.0, main_frame=frame, phase=phase)
        state = rules.ranks[0]
        for _ in range(2):  # the second read from what the first worked out
            assert in_collective(state) is inside, (t, frame)
            assert busy(state) is own, (t, phase)
