"""The launcher's decision when workers end: who replaces whom, or why not."""

from __future__ import annotations

import pytest

from rankguard.live.plan import SHRINK_YES, Assignment, Ended, Resumed, decide, ended_how


def _lost(rank: int, code: int = -9, error_file: bool = False) -> Ended:
    return Ended(local_rank=rank, rank=rank, pid=1000 + rank, exit_code=code, error_file=error_file)


def test_a_killed_rank_is_replaced_by_the_first_standby() -> None:
    decision = decide([_lost(2)], [4, 5], declared=True)
    assert decision.restart is None
    assert [(e.rank, slot) for e, slot in decision.pairs] == [(2, 4)]


def test_a_rank_the_hard_timeout_ended_is_replaced_like_a_dead_one() -> None:
    decision = decide([_lost(1, code=124)], [4], declared=True)
    assert decision.restart is None and [e.rank for e, _ in decision.pairs] == [1]


def test_no_standby_left_is_a_group_restart_said_once() -> None:
    decision = decide([_lost(2)], [], declared=True)
    assert decision.pairs == []
    assert decision.restart == "rank 2 (SIGKILL) lost and no standby left on this node"


def test_more_losses_than_standbys() -> None:
    decision = decide([_lost(1), _lost(2, code=124)], [4], declared=True)
    assert decision.restart is not None and "only 1 standby(s) left" in decision.restart
    assert "rank 2 (exit code 124)" in decision.restart


def test_no_standby_left_with_shrink_drops_the_rank() -> None:
    decision = decide([_lost(2)], [], declared=True, shrink=SHRINK_YES, world=4)
    assert decision.restart is None and decision.pairs == []
    assert [e.rank for e in decision.dropped] == [2]


def test_more_losses_than_standbys_with_shrink_replaces_then_drops() -> None:
    decision = decide([_lost(1), _lost(2)], [4], declared=True, shrink=SHRINK_YES, world=4)
    assert [(e.rank, slot) for e, slot in decision.pairs] == [(1, 4)]
    assert [e.rank for e in decision.dropped] == [2]


def test_a_shrink_that_cannot_apply_is_the_group_restart_said_why() -> None:
    decision = decide([_lost(0)], [], declared=True, shrink=SHRINK_YES, world=1)
    assert decision.restart == (
        "rank 0 (SIGKILL) lost and no standby left on this node; no shrink: no rank would be left"
    )
    decision = decide([_lost(2)], [], declared=True, shrink="several nodes", world=4)
    assert decision.restart is not None and decision.restart.endswith("no shrink: several nodes")
    assert decision.dropped == []
    # a standby waiting is used first: no shrink
    decision = decide([_lost(2)], [4], declared=True, shrink=SHRINK_YES, world=4)
    assert decision.dropped == [] and len(decision.pairs) == 1


def test_a_script_without_declared_state_restarts() -> None:
    decision = decide([_lost(2)], [4], declared=False)
    assert decision.restart is not None
    assert "declares no live state (rankguard.inprocess.live_state)" in decision.restart


def test_a_python_error_is_the_script_failing() -> None:
    decision = decide([_lost(1, code=1, error_file=True)], [4], declared=True)
    assert decision.restart is not None and "Python error" in decision.restart


def test_no_recovery_while_the_launcher_stops() -> None:
    decision = decide([_lost(1)], [4], declared=True, stopping="the job is preempted")
    assert decision.restart == "rank 1 (SIGKILL) lost while the job is preempted"


def test_nothing_lost_nothing_decided() -> None:
    assert decide([], [], declared=False).restart is None


def test_ended_how() -> None:
    assert ended_how(-9) == "SIGKILL"
    assert ended_how(-11) == "SIGSEGV"
    assert ended_how(124) == "exit code 124"


def test_records_round_trip_and_bad_ones_are_refused() -> None:
    got = Assignment(rank=2, local_rank=2, lost_pid=7, standby_pid=9, cause="x", fault_t=1.5)
    assert Assignment.from_json(got.to_json()) == got
    resumed = Resumed(t=3.0, step=11, steps_redone=0)
    assert Resumed.from_json(resumed.to_json()) == resumed
    with pytest.raises(ValueError):
        Assignment.from_json(
            '{"rank": -1, "local_rank": 0, "lost_pid": 1, "standby_pid": 2, '
            '"cause": "x", "fault_t": 0}'
        )
    with pytest.raises(ValueError):
        Assignment.from_json("[1, 2]")
    with pytest.raises(ValueError):
        Resumed.from_json("x" * 5000)
    with pytest.raises(ValueError):
        Resumed.from_json('{"t": 1, "step": 2}')
