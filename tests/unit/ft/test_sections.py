"""Section timeouts in the heartbeat rules (NVRx's setup/step/checkpointing sections, user
sections, time out of any section) and the restart window.

Pure logic with an explicit monitor clock. Heartbeat timeouts: process 10 s, progress
20 s, initial progress 60 s, checkpoint 100 s.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from rankguard.monitor.rules import HeartbeatRules, Liveness, Progress
from tests.factories import Feed as _Feed
from tests.factories import heartbeat_record, heartbeat_rules

RUN = "run-sections"

PROGRESS_TIMEOUT = "gpu_progress_timeout"
SECTION_TIMEOUT = "rank_section_timeout"
PROCESS_EXITED = "rank_process_exited"
EXCEEDED = "rank_section_exceeded_its_timeout"
OUT_OF_SECTION = "rank_out_of_section_too_long"


rec = partial(
    heartbeat_record, run_id=RUN, progress_seq=5, phase_elapsed=0.0, world_size=1, omit=("gpu",)
)
Feed = partial(_Feed, record=rec)


def _rules(
    sections: dict[str, float] | None = None,
    out_of_section: float | None = None,
    world: int = 1,
) -> HeartbeatRules:
    return heartbeat_rules(
        world,
        run_id=RUN,
        section_timeouts=sections,
        out_of_section_timeout=out_of_section,
    )


def run_stall(rules: HeartbeatRules, seconds: int, **kw: Any) -> list[tuple[int, dict[str, Any]]]:
    """One rank beating every second with no progress since t=0, in its phase since
    then unless ``phase_elapsed`` says otherwise; (t, finding) pairs."""
    feed = Feed(rules)
    out: list[tuple[int, dict[str, Any]]] = []
    for t in range(seconds):
        feed.beat(0, t, since=float(t), **{"phase_elapsed": float(t), **kw})
        out += [(t, f) for f in rules.evaluate(t + 0.1)]
    return out


# ---- sections replacing the progress timeouts ----------------------------------------


def test_step_section_replaces_progress_timeout_when_shorter() -> None:
    found = run_stall(_rules({"step": 5.0}), 30)
    assert [(t, f.finding_type) for t, f in found] == [(5, PROGRESS_TIMEOUT)]
    f = found[0][1]
    assert f.timeout_s == 5.0
    assert f.observed_s == pytest.approx(5.1)
    assert f.process_liveness == "alive"
    assert f.gpu_progress == "stalled"


def test_step_section_replaces_progress_timeout_when_longer() -> None:
    rules = _rules({"step": 40.0})
    found = run_stall(rules, 50)
    assert [(t, f.finding_type) for t, f in found] == [(40, PROGRESS_TIMEOUT)]
    assert found[0][1].timeout_s == 40.0


def test_step_section_applies_to_the_step_phase_too() -> None:
    found = run_stall(_rules({"step": 5.0}), 10, phase="step")
    assert [(t, f.finding_type) for t, f in found] == [(5, PROGRESS_TIMEOUT)]


def test_setup_section_replaces_initial_progress_timeout() -> None:
    found = run_stall(_rules({"setup": 15.0}), 70, progress_seq=0, phase="setup")
    assert [(t, f.finding_type) for t, f in found] == [(15, PROGRESS_TIMEOUT)]
    assert found[0][1].timeout_s == 15.0
    # Without the section, the 60 s initial progress timeout applies.
    found = run_stall(_rules(), 70, progress_seq=0, phase="setup")
    assert [t for t, _ in found] == [60]


def test_setup_section_does_not_apply_after_the_first_step() -> None:
    found = run_stall(_rules({"setup": 5.0}), 30)
    assert [(t, f.timeout_s) for t, f in found] == [(20, 20.0)]


def test_checkpointing_section_replaces_checkpoint_timeout_while_saving() -> None:
    kw: dict[str, Any] = {"checkpoint_active": True, "phase": "checkpointing"}
    found = run_stall(_rules({"checkpointing": 30.0}), 60, **kw)
    assert [(t, f.finding_type) for t, f in found] == [(30, PROGRESS_TIMEOUT)]
    assert found[0][1].timeout_s == 30.0
    assert found[0][1].checkpoint_active is True
    # Without the section, the 100 s checkpoint timeout applies.
    assert run_stall(_rules(), 60, **kw) == []
    # The step section does not apply while saving.
    assert run_stall(_rules({"step": 5.0}), 60, **kw) == []


# ---- named sections and time out of any section --------------------------------------


def test_user_section_times_out_by_phase_elapsed() -> None:
    rules = _rules({"eval": 10.0})
    feed = Feed(rules)
    found: list[tuple[int, dict[str, Any]]] = []
    for t in range(30):
        # Progress stopped at t=0, when eval started: only the section timeout counts.
        feed.beat(0, t, phase="eval", phase_elapsed=float(t), since=float(t))
        found += [(t, f) for f in rules.evaluate(t + 0.5)]
    assert [(t, f.finding_type) for t, f in found] == [(10, SECTION_TIMEOUT)]
    f = found[0][1]
    assert f.reason == EXCEEDED
    assert f.timeout_s == 10.0
    assert f.observed_s == pytest.approx(10.5)
    assert f.phase == "eval"
    assert f.process_liveness == "alive"
    assert "section 'eval'" in f.message


def test_section_elapsed_is_record_elapsed_plus_heartbeat_age() -> None:
    rules = _rules({"eval": 10.0})
    # The publisher says the section started 8 s ago; no newer record arrives.
    assert rules.ingest(rec(0, 0, phase="eval", phase_elapsed=8.0), 0.0)
    assert rules.evaluate(1.0) == []  # 8 + 1 = 9 s
    assert rules.evaluate(1.9) == []  # 9.9 s
    found = rules.evaluate(2.5)  # 10.5 s
    assert [f.finding_type for f in found] == [SECTION_TIMEOUT]
    assert found[0].observed_s == pytest.approx(10.5)


def test_no_progress_timeout_inside_a_section() -> None:
    rules = _rules({"eval": 100.0})
    feed = Feed(rules)
    for t in range(60):  # no progress for 60 s > 20 s progress timeout
        feed.beat(0, t, phase="eval", phase_elapsed=float(t), since=float(t))
        assert rules.evaluate(t + 0.5) == [], t
        assert rules.ranks[0].progress is Progress.PROGRESSING
        assert rules.ranks[0].liveness is Liveness.ALIVE


def test_section_timeout_for_another_phase_does_not_apply() -> None:
    # eval has a timeout, the rank is in "predict": the progress timeout (20 s) applies.
    found = run_stall(_rules({"eval": 5.0}), 30, phase="predict", phase_elapsed=0.0)
    assert [(t, f.finding_type) for t, f in found] == [(20, PROGRESS_TIMEOUT)]


def test_out_of_section_timeout() -> None:
    rules = _rules({"step": 50.0}, out_of_section=10.0)
    feed = Feed(rules)
    found: list[tuple[int, dict[str, Any]]] = []
    for t in range(30):
        feed.beat(0, t, phase="custom", phase_elapsed=float(t), since=float(t))
        found += [(t, f) for f in rules.evaluate(t + 0.5)]
    assert [(t, f.finding_type) for t, f in found] == [(10, SECTION_TIMEOUT)]
    f = found[0][1]
    assert f.reason == OUT_OF_SECTION
    assert f.timeout_s == 10.0
    assert "out-of-section phase 'custom'" in f.message


def test_out_of_section_does_not_apply_to_train_or_named_sections() -> None:
    # Training steps use the step timeout, not the out-of-section one.
    assert run_stall(_rules(out_of_section=5.0), 20) == []
    # A named section uses its own timeout, not the out-of-section one.
    rules = _rules({"eval": 30.0}, out_of_section=5.0)
    feed = Feed(rules)
    for t in range(25):
        feed.beat(0, t, phase="eval", phase_elapsed=float(t), since=float(t))
        assert rules.evaluate(t + 0.5) == []


def test_leaving_the_section_clears_it_so_it_fires_again() -> None:
    rules = _rules({"eval": 5.0})
    feed = Feed(rules)
    found: list[tuple[int, dict[str, Any]]] = []
    progress = 5
    for t in range(40):
        if t < 12 or t >= 20:  # eval from 0 and again from 20
            start = 0 if t < 12 else 20
            kw: dict[str, Any] = {"phase": "eval", "phase_elapsed": float(t - start)}
        else:  # training steps in between
            progress += 1
            kw = {"phase": "train", "phase_elapsed": float(t - 12), "since": 0.2}
        feed.beat(0, t, progress_seq=progress, **kw)
        found += [(t, f) for f in rules.evaluate(t + 0.5)]
        if 12 <= t < 20:
            assert SECTION_TIMEOUT not in rules.ranks[0].active
    assert [(t, f.finding_type) for t, f in found] == [
        (5, SECTION_TIMEOUT),
        (25, SECTION_TIMEOUT),
    ]


# ---- restarts ------------------------------------------------------------------------


def _two_ranks() -> tuple[HeartbeatRules, Feed]:
    rules = _rules(world=2)
    feed = Feed(rules)
    for rank in (0, 1):
        feed.beat(rank, 0.0)
    assert rules.evaluate(0.5) == []
    return rules, feed


def test_exits_while_restarting_are_not_findings() -> None:
    rules, feed = _two_ranks()
    rules.note_restart("restart after gpu_progress_timeout on rank 1")
    crash = {"clean": False, "exit_code": -9, "error": "killed"}
    for rank in (1, 0):
        feed.beat(rank, 1.0, event="process_end", exit=crash)
    assert rules.evaluate(1.5) == []
    for rank in (0, 1):
        state = rules.ranks[rank]
        assert state.liveness is Liveness.EXITED
        assert state.record is not None
        assert state.record.exit["after_restart"] == (
            "restart after gpu_progress_timeout on rank 1"
        )
    assert rules.restarting is not None


def test_without_note_restart_the_exit_is_a_finding() -> None:
    rules, feed = _two_ranks()
    feed.beat(1, 1.0, event="process_end", exit={"clean": False, "exit_code": 1})
    assert [(f.rank, f.finding_type) for f in rules.evaluate(1.5)] == [(1, PROCESS_EXITED)]


def test_a_peer_failure_restart_still_names_the_cause_relayed_a_moment_later() -> None:
    """Node 0's rank failed in its broken collective and the agent restarted before the
    peer's own end came through its node's relay (the monitor had seen no rank fail):
    that end, with the peer's own error, is still the cause; for one relay period."""
    rules, feed = _two_ranks()
    peer = "RuntimeError: Connection closed by peer [127.0.0.1]:43410"
    feed.beat(0, 1.0, event="process_end", exit={"clean": False, "exit_code": 1, "error": peer})
    assert rules.evaluate(1.1) == []  # a victim's end is held, the cause may follow
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=1.2)
    own = {"clean": False, "exit_code": 1, "error": "RuntimeError: rank 1 crashes at step 3"}
    feed.beat(1, 1.5, event="process_end", exit=own)
    found = rules.evaluate(1.6)
    assert [(f.rank, f.finding_type.value) for f in found] == [(1, PROCESS_EXITED)]
    assert rules.first_failure is not None and rules.first_failure[0] == 1


@pytest.mark.parametrize(
    ("error", "at"),
    [
        ("RuntimeError: rank 1 crashes at step 3", 9.0),  # past the relay period
        ("RuntimeError: Connection reset by peer", 1.5),  # a victim too
        ("SystemExit(-15)", 1.5),  # the restart's own signal
        ("KeyboardInterrupt: ", 1.5),
    ],
    ids=["late", "peer", "sigterm", "interrupt"],
)
def test_a_pending_cause_is_only_an_own_error_within_the_relay_period(
    error: str, at: float
) -> None:
    rules, feed = _two_ranks()
    rules.note_restart("restart 1: worker_failed", cause_pending=True, now=1.2)
    feed.beat(1, at, event="process_end", exit={"clean": False, "exit_code": 1, "error": error})
    assert rules.evaluate(at + 0.1) == []
    assert rules.ranks[1].record is not None
    assert rules.ranks[1].record.exit["after_restart"] == "restart 1: worker_failed"


def test_a_restart_with_its_cause_known_names_no_later_exit() -> None:
    rules, feed = _two_ranks()
    feed.beat(1, 1.0, event="process_end", exit={"clean": False, "exit_code": 1, "error": "x"})
    assert [f.rank for f in rules.evaluate(1.1)] == [1]
    rules.note_restart("restart 1: rank_process_exited", cause_pending=True, now=1.2)
    assert rules.cause_pending_until is None  # a first failure was seen: nothing pending
    own = {"clean": False, "exit_code": 1, "error": "RuntimeError: teardown"}
    feed.beat(0, 1.5, event="process_end", exit=own)
    assert rules.evaluate(1.6) == []


def test_first_new_pid_ends_the_restart_window() -> None:
    rules, feed = _two_ranks()
    rules.note_restart("restart 1")
    crash = {"clean": False, "exit_code": -15}
    feed.beat(0, 1.0, event="process_end", exit=crash)
    assert rules.evaluate(1.5) == []
    # The new worker group: rank 0's new process appears.
    assert rules.ingest(rec(0, 0, t=5.0, pid=2000), 5.0)
    assert rules.restarting is None
    assert rules.ranks[0].pid == 2000
    assert rules.ranks[0].liveness is Liveness.NOT_OBSERVED  # reset, evaluated next
    assert rules.evaluate(5.5) == []
    assert rules.ranks[0].liveness is Liveness.ALIVE
    # From now on an error exit is a finding again.
    assert rules.ingest(
        rec(0, 1, t=6.0, pid=2000, event="process_end", exit={"clean": False, "exit_code": 1}),
        6.0,
    )
    found = rules.evaluate(6.5)
    assert [(f.rank, f.pid, f.finding_type) for f in found] == [(0, 2000, PROCESS_EXITED)]


# ---- the in-process restart's phase --------------------------------------------------


@pytest.mark.parametrize("awaiting", [None, 120.0])
def test_a_re_entry_waiting_for_a_standby_on_its_way_has_the_barriers_bound(
    awaiting: float | None,
) -> None:
    """A rank re-entering in-process has the hard timeout (6 s here), except while its
    barrier waits for a lost peer's standby that is on its way: a standby refilled a
    moment before the loss is still starting its interpreter, and the barrier waits for it
    up to its own timeout (120 s): until then that wait is the recovery, not a hang."""
    rules = _rules({"inprocess_restart": 6.0})
    block = {"restarts": 2, "recovering": True}
    if awaiting is not None:
        block["awaiting_standby_s"] = awaiting
    found = run_stall(rules, 30, phase="inprocess_restart", inprocess=block)
    if awaiting is None:
        assert [(t, f.finding_type) for t, f in found] == [(6, SECTION_TIMEOUT)]
    else:
        assert found == []
        # past the barrier's own bound it is a finding again
        late = run_stall(
            _rules({"inprocess_restart": 6.0}), 125, phase="inprocess_restart", inprocess=block
        )
        assert [(t, f.finding_type) for t, f in late] == [(120, SECTION_TIMEOUT)]
