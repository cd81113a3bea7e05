"""Live recovery in the goodput ledger: a lost rank replaced by a standby while the job
goes on (a ``live_recovery`` line of restarts.jsonl), on synthetic run directories
whose true timeline is known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.goodput import Attempt, LiveRecovery, Part, build_ledger, read_ledger
from tests.unit.goodput.synthetic import T0, Rank0, append, run_dir, train


def check(got: dict[Part, float], want: dict[Part, float], wall: float) -> None:
    for part in Part:
        assert got[part] == pytest.approx(want.get(part, 0.0), abs=0.5), part
    assert sum(got.values()) == pytest.approx(wall, rel=0.01)


def _line(**over: Any) -> dict[str, Any]:
    return {
        "kind": "live_recovery",
        "lost_rank": 3,
        "lost_pid": 9003,
        "standby_pid": 9100,
        "cause": "rank_process_exited",
        "fault_t": T0 + 15.2,
        "resumed_t": T0 + 18.2,
        "steps_redone": 5,
        **over,
    }


# 5 s start-up, 0.5 s steps to iteration 20 (T0 + 14.5); rank 3 lost, seen at T0 + 15.2;
# training goes on at T0 + 18.2 from iteration 15 (5 steps redone), to iteration 30
WANT = {
    Part.STARTUP: 5.0,
    Part.PRODUCTIVE: 7.0 + 7.5,  # iterations 2-15, then 16-30 again
    Part.RECOMPUTED: 2.5,  # iterations 16-20 the first time
    Part.DETECTION_WAIT: 0.7,
    Part.RECOVERY: 3.0,
    Part.UNKNOWN: 0.3,
}


def _resume(rank: Rank0) -> float:
    rank.set_phase("train", T0 + 18.2)
    rank.iteration = 15  # the ranks went back to iteration 15
    t = train(rank, T0 + 18.2, 15, 0.5, {})
    rank.end(t + 0.3, clean=True)
    return t + 0.3


def test_a_peer_replaced_while_rank_0_went_on(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=101, start=T0)
    rank.step(T0 + 5.0)
    assert train(rank, T0 + 5.0, 19, 0.5, {}) == T0 + 14.5
    rank.idle_to(T0 + 18.2)  # blocked in a collective: heartbeats, no step
    end = _resume(rank)
    rank.write()
    append(d / "restarts.jsonl", _line())
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 1
    wall = end - T0
    assert sum(WANT.values()) == pytest.approx(wall)
    check(ledger.parts, WANT, wall)
    (cut,) = ledger.interruptions
    assert (cut.kind, cut.cause, cut.iteration, cut.resumed_from) == (
        "live_recovery",
        "rank_process_exited",
        20,
        15,
    )
    assert cut.first_evidence_s == pytest.approx(0.7, abs=0.01)
    assert cut.parts[Part.RECOVERY] == pytest.approx(3.0, abs=0.01)
    assert cut.parts[Part.RECOMPUTED] == pytest.approx(2.5, abs=0.01)
    assert cut.to_dict()["kind"] == "live_recovery"


def test_rank_0_replaced_by_its_standby_is_one_attempt(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    lost = Rank0(d, pid=101, start=T0)
    lost.step(T0 + 5.0)
    train(lost, T0 + 5.0, 19, 0.5, {})
    lost.idle_to(T0 + 15.0)  # killed: no process_end
    lost.write()
    standby = Rank0(d, pid=303, start=T0 + 16.0, iteration=15)
    standby.progress = 100  # its own step count, nothing to do with the lost one's
    end = _resume(standby)
    standby.perf.clear()  # the lost process's perf windows are the run's
    standby.write()
    append(d / "restarts.jsonl", _line(lost_rank=0, lost_pid=101, standby_pid=303))
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 1
    check(ledger.parts, WANT, end - T0)
    assert [i.kind for i in ledger.interruptions] == ["live_recovery"]


def test_no_resumed_time_is_recovery_until_the_next_step() -> None:
    steps = [(i, 5.0 + 0.5 * (i - 1)) for i in range(1, 21)]
    steps += [(i, 20.0 + 0.5 * (i - 20)) for i in range(21, 31)]
    live = LiveRecovery(fault=15.0, cause="lost peer")
    ledger = build_ledger([Attempt(start=0.0, end=25.0, steps=steps, live=[live])])
    (cut,) = ledger.interruptions
    assert cut.parts[Part.DETECTION_WAIT] == pytest.approx(0.5)
    assert cut.parts[Part.RECOVERY] == pytest.approx(5.5)  # to the step at 20.5
    assert Part.RECOMPUTED not in cut.parts
    assert sum(ledger.parts.values()) == pytest.approx(25.0)


def test_a_live_recovery_then_a_restart_are_two_interruptions_in_order() -> None:
    first = Attempt(
        start=0.0,
        end=30.0,
        steps=[(i, 2.0 + i) for i in range(1, 25)],
        live=[LiveRecovery(fault=10.5, resumed=12.0, steps_redone=2)],
        failed=True,
        decision=28.0,
        cause="worker_failed",
    )
    second = Attempt(start=31.0, end=40.0, steps=[(21, 35.0), (25, 39.0)], resumed_from=20)
    ledger = build_ledger([first, second])
    assert [(i.kind, i.cause) for i in ledger.interruptions] == [
        ("live_recovery", None),
        ("restart", "worker_failed"),
    ]
    assert sum(ledger.parts.values()) == pytest.approx(ledger.wall_s)


def test_a_live_recovery_and_a_re_entry_in_one_attempt_each_have_their_parts(
    tmp_path: Path,
) -> None:
    """A peer lost at iteration 20 and replaced live (rank 0's survivors' re-entry is the
    recovery's), then at iteration 40 a peer stuck: rank 0 waited 2 s in its collective
    until its process-group timeout raised, re-entered in process in 0.1 s and went on
    after iteration 40 (nothing done again). The 2 s are the re-entry's detection wait,
    not training; nothing of either is productive or unknown."""
    d = run_dir(tmp_path)
    rank = Rank0(d, pid=101, start=T0)
    rank.step(T0 + 5.0)
    train(rank, T0 + 5.0, 19, 0.5, {})  # to iteration 20 at T0 + 14.5
    rank.reenter(T0 + 15.3, T0 + 15.6)  # the survivors' re-entry of the live recovery
    rank.set_phase("train", T0 + 18.2)
    rank.iteration = 15
    step40 = train(rank, T0 + 18.2, 25, 0.5, {})  # 16-40, to T0 + 30.7
    rank.idle_to(step40 + 2.0)  # blocked in a collective: heartbeats, no step
    rank.reenter(step40 + 2.0, step40 + 2.1)
    t = train(rank, step40 + 2.1, 10, 0.5, {})  # 41-50
    rank.end(t + 0.3, clean=True)
    rank.write()
    append(d / "restarts.jsonl", _line())
    ledger = read_ledger(d)
    assert ledger is not None and ledger.attempts == 1
    live, reentry = ledger.interruptions
    assert (live.kind, live.iteration, live.resumed_from) == ("live_recovery", 20, 15)
    assert live.parts[Part.DETECTION_WAIT] == pytest.approx(0.7, abs=0.01)
    assert live.parts[Part.RECOVERY] == pytest.approx(3.0, abs=0.01)
    assert (reentry.kind, reentry.iteration, reentry.resumed_from) == ("inprocess", 40, 40)
    assert reentry.first_evidence_s == pytest.approx(2.0, abs=0.01)
    assert reentry.parts == {
        Part.DETECTION_WAIT: pytest.approx(2.0, abs=0.01),
        Part.RECOVERY: pytest.approx(0.1, abs=0.01),
    }
    want = dict(WANT)
    want[Part.PRODUCTIVE] = 7.0 + 12.5 + 5.0  # iterations 2-15, 16-40, 41-50
    want[Part.DETECTION_WAIT] = 0.7 + 2.0
    want[Part.RECOVERY] = 3.0 + 0.1
    check(ledger.parts, want, t + 0.3 - T0)


def test_a_re_entry_after_a_live_recovery_without_a_resumed_time_is_its_own() -> None:
    """A live recovery that gives no resumed time lasts to the next step after its
    fault: a re-entry later in the attempt is no part of it."""
    steps = [(i, 5.0 + 0.5 * (i - 1)) for i in range(1, 21)]  # to 14.5
    steps += [(i, 16.0 + 0.5 * (i - 21)) for i in range(21, 41)]  # 16.0 to 25.5
    steps += [(i, 28.5 + 0.5 * (i - 41)) for i in range(41, 51)]  # 28.5 to 33.0
    ledger = build_ledger(
        [
            Attempt(
                start=0.0,
                end=33.0,
                steps=steps,
                live=[LiveRecovery(fault=15.0)],
                phases=[("inprocess_restart", 27.5, 28.0)],
            )
        ]
    )
    assert [i.kind for i in ledger.interruptions] == ["live_recovery", "inprocess"]
    reentry = ledger.interruptions[1]
    assert reentry.parts == {
        Part.DETECTION_WAIT: pytest.approx(2.0),  # 25.5 -> 27.5
        Part.RECOVERY: pytest.approx(0.5),
    }


def test_a_re_entry_within_another_faults_detection_wait_costs_nothing_more() -> None:
    """Rank 0's collective timed out 2 s after its last step (iteration 20 at 14.5) and
    it re-entered in process, but its peer never came back: the fault ended in a group
    restart (decided at 20.0), or in a live recovery (the peer's process ended at 25.0).
    The wait from the last step is that interruption's cost; the re-entry inside it is
    listed with no time of its own: each second is one interruption's."""
    steps = [(i, 5.0 + 0.5 * (i - 1)) for i in range(1, 21)]  # to 14.5
    reentry = [("inprocess_restart", 16.5, 16.6)]
    failed = Attempt(start=0.0, end=20.5, steps=steps, phases=reentry, failed=True, decision=20.0)
    nxt = Attempt(start=21.0, end=30.0, steps=[(21, 25.0), (30, 29.5)], resumed_from=20)
    for attempts in (
        [failed, nxt],
        [
            Attempt(
                start=0.0,
                end=30.0,
                steps=[*steps, *[(i, 25.5 + 0.5 * (i - 21)) for i in range(21, 30)]],
                phases=reentry,
                live=[LiveRecovery(fault=25.0, resumed=25.5)],
            )
        ],
    ):
        ledger = build_ledger(attempts)
        kinds = {cut.kind: cut for cut in ledger.interruptions}
        assert kinds["inprocess"].parts == {}
        other = kinds["restart" if "restart" in kinds else "live_recovery"]
        assert other.parts[Part.DETECTION_WAIT] == pytest.approx(
            5.5 if "restart" in kinds else 10.5
        )
        lost = sum(v for p, v in ledger.parts.items() if p is not Part.PRODUCTIVE)
        assert (
            sum(cut.cost_s for cut in ledger.interruptions) <= lost - 5.0 + 1e-9
        )  # less the first start-up
