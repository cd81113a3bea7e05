"""Phases in the rules: eval and checkpoint timeouts, the clock restarting when train
resumes, ranks waiting for a peer that saves or evaluates, section timeouts."""

from __future__ import annotations

from typing import Any

from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import FindingType, Progress
from tests.factories import RUN_ID, Feed, heartbeat_config, types_of


def _rules(world: int = 2, **kw: Any) -> HeartbeatRules:
    """progress 20 s, checkpoint 100 s, eval 50 s."""
    return HeartbeatRules(
        heartbeat_config(eval_timeout_s=50.0),
        RUN_ID,
        expected_world_size=world,
        started_at=0.0,
        **kw,
    )


def _run(
    rules: HeartbeatRules, until: int, phases: dict[int, Any], *, stuck_at: float = 0.0
) -> list[tuple[int, str]]:
    """Every rank beats each second from t=0, no step since ``stuck_at``; ``phases``:
    rank -> phase, or a function of t giving (phase, phase_elapsed)."""
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    for t in range(until + 1):
        now = float(t)
        for rank in range(rules.expected_world_size or 0):
            phase = phases.get(rank, "train")
            if callable(phase):
                phase, elapsed = phase(now)
            else:
                elapsed = now - stuck_at
            feed.beat(
                rank,
                now,
                progress_seq=5,
                since=now - stuck_at,
                phase=phase,
                phase_elapsed=elapsed,
            )
        found += types_of(rules.evaluate(now))
    return found


def test_eval_has_its_own_timeout() -> None:
    rules = _rules(world=1)
    assert _run(rules, 45, {0: "eval"}) == []  # 45 s > progress 20 s, < eval 50 s
    assert rules.ranks[0].progress is Progress.PROGRESSING
    rules = _rules(world=1)
    found = _run(rules, 52, {0: "eval"})
    assert found == [(0, "gpu_progress_timeout")]


def test_a_hang_in_eval_is_named_with_its_phase() -> None:
    rules = _rules(world=1)
    feed = Feed(rules)
    findings = []
    for t in range(53):
        feed.beat(0, float(t), progress_seq=5, since=float(t), phase="eval", phase_elapsed=t)
        findings += rules.evaluate(float(t))
    assert len(findings) == 1
    assert findings[0].phase == "eval" and findings[0].timeout_s == 50.0
    assert "phase eval" in findings[0].message


def test_recognised_checkpoint_phase_gets_the_checkpoint_timeout() -> None:
    rules = _rules(world=1)
    assert _run(rules, 90, {0: "checkpointing"}) == []
    rules = _rules(world=1)
    assert _run(rules, 102, {0: "checkpointing"}) == [(0, "gpu_progress_timeout")]


def test_closing_gets_the_checkpoint_timeout() -> None:
    """After the script returned, the session closes (the trackers' flush can take
    seconds): no step is due, the checkpoint timeout bounds it."""
    rules = _rules(world=1)
    assert _run(rules, 90, {0: "closing"}) == []  # 90 s > progress 20 s, < checkpoint 100 s
    assert rules.ranks[0].progress is Progress.PROGRESSING
    rules = _rules(world=1)
    assert _run(rules, 102, {0: "closing"}) == [(0, "gpu_progress_timeout")]


def test_a_rank_stalled_in_train_while_its_peer_closes_is_blocked_by_it() -> None:
    """Rank 0 flushes its trackers at the end; rank 1 waits in train (the last barrier):
    rank 1 is blocked by rank 0 for rank 0's closing timeout, not hung."""
    rules = _rules(world=2)
    assert _run(rules, 60, {0: "closing", 1: "train"}) == []
    assert rules.ranks[1].blocked_by == [0]


def test_train_after_a_long_eval_is_not_late() -> None:
    """The eval lasted 40 s (no step); train resumed 3 s ago, its next step is slow:
    the progress clock restarted with the phase."""
    rules = _rules(world=1)

    def phase(now: float) -> tuple[str, float]:
        return ("eval", now) if now < 40 else ("train", now - 40)

    assert _run(rules, 55, {0: phase}) == []  # train since 40: 15 s < 20 s
    found = _run(_rules(world=1), 62, {0: phase})
    assert found == [(0, "gpu_progress_timeout")]  # and a real stall still counts


def test_ranks_waiting_for_a_saving_peer_are_blocked_not_hung() -> None:
    """Rank 0 saves alone for 60 s (> progress 20 s); ranks 1 and 2 wait at the next
    collective in train: no finding; they are blocked by rank 0."""
    rules = _rules(world=3)
    assert _run(rules, 60, {0: "checkpointing"}) == []
    for rank in (1, 2):
        assert rules.ranks[rank].progress is Progress.STALLED
        assert rules.ranks[rank].blocked_by == [0]


def test_a_rank_stuck_in_train_while_its_peer_waits_for_it_inside_the_save_is_named() -> None:
    """Rank 1 hangs in train while rank 0 saves: rank 0's save waits for rank 1 in a
    collective (its main thread sits in ``all_gather``), so rank 1 is not blocked by rank
    0 and is reported at its progress timeout (20 s), not after the checkpoint timeout
    (100 s) that rank 0's phase allows. A peer that saves on its own (its main thread not
    in a collective) still blocks the ranks waiting for it (the test above)."""
    rules = _rules(world=2)
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    for t in range(26):
        now = float(t)
        feed.beat(
            0,
            now,
            progress_seq=5,
            since=now,
            phase="checkpointing",
            phase_elapsed=now,
            main_frame="distributed_c10d.py:4312 in all_gather_object",
        )
        feed.beat(1, now, progress_seq=5, since=now, phase="train", phase_elapsed=now)
        found += [(t, *f) for f in types_of(rules.evaluate(now))]
    assert found == [(21, 1, "gpu_progress_timeout")]
    assert rules.ranks[1].blocked_by == []


def test_saving_rank_that_overstays_is_the_one_named() -> None:
    """Rank 2 hangs in its save: only rank 2 is reported (checkpoint timeout); the
    ranks waiting for it stay blocked by it."""
    rules = _rules(world=3)
    found = _run(rules, 130, {2: "checkpointing"})
    assert found == [(2, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [2] and rules.ranks[1].blocked_by == [2]


def test_peer_evaluating_past_its_timeout_is_named_not_the_rank_waiting() -> None:
    """Rank 1 (higher rank) evaluates with no step for longer than the eval timeout;
    rank 0 waits for it in train: rank 1 is reported, rank 0 stays blocked by it."""
    found = _run(_rules(world=2), 49, {1: "eval"})
    assert found == []
    rules = _rules(world=2)
    found = _run(rules, 55, {1: "eval"})
    assert found == [(1, "gpu_progress_timeout")]
    assert rules.ranks[0].blocked_by == [1]


def test_hang_in_a_training_step_is_still_a_progress_timeout() -> None:
    rules = _rules(world=2)
    found = _run(rules, 22, {})
    assert sorted(found) == [(0, "gpu_progress_timeout"), (1, "gpu_progress_timeout")]


def test_megatron_sections_train_is_the_step_section() -> None:
    """setup:6 with a healthy run in train for 100 s: no section timeout (the phase left
    setup); step:20 applies to progress; eval is out of section (30 s)."""
    sections = {"setup": 6.0, "step": 20.0, "checkpointing": 40.0}
    rules = _rules(world=1, section_timeouts=sections, out_of_section_timeout=30.0)
    feed = Feed(rules)
    for t in range(100):  # a step every second: since stays 0.5
        feed.beat(0, float(t), progress_seq=t + 1, phase="train", phase_elapsed=float(t))
        assert rules.evaluate(float(t)) == []
    rules = _rules(world=1, section_timeouts=sections, out_of_section_timeout=30.0)
    assert _run(rules, 28, {0: "eval"}) == []
    found = _run(
        _rules(world=1, section_timeouts=sections, out_of_section_timeout=30.0), 32, {0: "eval"}
    )
    assert found == [(0, FindingType.SECTION_TIMEOUT.value)]
    rules = _rules(world=1, section_timeouts=sections, out_of_section_timeout=30.0)
    assert _run(rules, 38, {0: "checkpointing"}) == []
    rules = _rules(world=1, section_timeouts=sections, out_of_section_timeout=30.0)
    assert _run(rules, 42, {0: "checkpointing"}) == [(0, "gpu_progress_timeout")]


def _eval_before_the_first_step(rules: HeartbeatRules, until: int = 30) -> list[tuple[int, str]]:
    """nanoGPT: set-up 3 s, then rank 0 evaluates (estimate_loss at iteration 0) for 17 s
    while rank 1 waits for it at its first collective; both step from t=22 on."""
    feed = Feed(rules)
    found: list[tuple[int, str]] = []
    for t in range(until + 1):
        now = float(t)
        steps = max(0, t - 21)
        for rank in (0, 1):
            if steps:
                phase, elapsed = "train", now - 22
            elif rank == 0 and 3 <= t < 20:
                phase, elapsed = "eval", now - 3
            elif rank == 0 and t >= 20:
                phase, elapsed = "setup", now - 20
            else:
                phase, elapsed = "setup", now
            feed.beat(
                rank,
                now,
                progress_seq=steps,
                since=0.5 if steps else now,
                phase=phase,
                phase_elapsed=elapsed,
            )
        found += types_of(rules.evaluate(now))
    return found


def test_an_evaluation_before_the_first_step_is_an_evaluation() -> None:
    """NVRx's setup section (6 s) or a short initial progress timeout (10 s) does not
    apply to an evaluation before step 1: its own timeout does (50 s), the rank waiting
    for it is blocked by it, and set-up's clock restarts after it."""
    sections = _rules(section_timeouts={"setup": 6.0, "step": 20.0})
    assert _eval_before_the_first_step(sections) == []
    short = HeartbeatRules(
        heartbeat_config(eval_timeout_s=50.0, initial_progress_timeout_s=10.0),
        RUN_ID,
        expected_world_size=2,
        started_at=0.0,
    )
    assert _eval_before_the_first_step(short) == []
    # a real hang in that evaluation is still found, named with its phase
    hung = _rules(section_timeouts={"setup": 6.0, "step": 20.0})
    feed = Feed(hung)
    found = []
    for t in range(60):
        phase = ("eval", t - 3.0) if t >= 3 else ("setup", float(t))
        feed.beat(
            0, float(t), progress_seq=0, since=float(t), phase=phase[0], phase_elapsed=phase[1]
        )
        feed.beat(
            1, float(t), progress_seq=0, since=float(t), phase="setup", phase_elapsed=float(t)
        )
        found += hung.evaluate(float(t))
    assert [(f.rank, f.phase) for f in found] == [(0, "eval")], found
    assert found[0].timeout_s == 50.0
