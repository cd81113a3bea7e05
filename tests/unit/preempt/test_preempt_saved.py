"""What a preemption saved: each rank reports its last completed save (the script's
step and the training steps it covers) in its heartbeat's ``preempt`` block, and node 0
says "every rank saved script step N" only when every rank's save covers the agreed stop step.
A clean exit at the stop step is no save (a script may stop without one)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rankguard.cli.status_render import _preemption_lines
from rankguard.preempt import PreemptionConfig, TorchFileSaver, save_and_wait
from rankguard.preempt.budget import GraceBudget
from rankguard.preempt.coordinator import PreemptionEvaluator
from rankguard.preempt.rank import RankPreemption
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.blocks import PreemptBlock
from rankguard.schema.findings import Finding, Reason
from tests.factories import heartbeat_config, heartbeat_record, heartbeat_rules, rank_identity

pytestmark = pytest.mark.timeout(30)

STOP = 75


def _evaluator(stop: int | None = STOP) -> PreemptionEvaluator:
    reason = "preempted: node 0's launcher received SIGTERM"
    coordinator = SimpleNamespace(
        active=True,
        stop_at=stop,
        reason=reason,
        sig=15,
        cfg=SimpleNamespace(preempt_time=60.0),
        terminated=[],
    )
    return PreemptionEvaluator(coordinator, GraceBudget(60.0, 1.0), "run")  # type: ignore[arg-type]


def _ended(saves: list[tuple[int, int] | None], *, clean: bool = True) -> tuple[Any, Any]:
    """Every rank's process_end at the stop step, its ``preempt`` block naming its last
    completed save as (step, training steps) or none."""
    rules = heartbeat_rules(len(saves))
    # a clean end at the stop step: the rank left at the request (should_stop said stop)
    exit_info = {"clean": True, "stopped_at": STOP} if clean else {"clean": False, "exit_code": 1}
    for rank, save in enumerate(saves):
        block: dict[str, Any] = {"signal_received": True}
        if save is not None:
            block["saved_step"], block["saved_seq"] = save
        raw = heartbeat_record(
            rank,
            event="process_end",
            exit=exit_info,
            world_size=len(saves),
            progress_seq=STOP + (1 if save is not None and save[1] == STOP else 0),
            preempt=block,
        )
        rules.ingest(raw, 1.0)
    rules.evaluate(1.0)
    return rules, rules.ranks


def _outcome(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.reason is not Reason.EXIT_SIGNAL]


def test_every_rank_saved_the_stop_step() -> None:
    ev = _evaluator()
    _, ranks = _ended([(STOP, STOP), (STOP, STOP)])
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_SAVED
    assert outcome.detail["saved_step"] == STOP
    assert ev.saved_line() == f"every rank saved script step {STOP}: the next run resumes there"
    status = ev.status()
    assert status is not None and status.saved_step == STOP and status.ranks_saved == 2


def test_a_resumed_run_names_the_step_the_script_saved() -> None:
    """The stop step counts this process's training steps; the save names the script's
    step (a run resumed from step 100 stops 75 steps later and saves step 175)."""
    ev = _evaluator()
    _, ranks = _ended([(100 + STOP, STOP), (100 + STOP, STOP)])
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_SAVED
    assert (
        ev.saved_line() == f"every rank saved script step {100 + STOP}: the next run resumes there"
    )


def test_no_save_at_all_is_said() -> None:
    """The demo with --checkpoint-every and no directory: every rank stopped at the stop
    step and exited cleanly, nothing was ever saved."""
    ev = _evaluator()
    _, ranks = _ended([None, None])
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_NOT_SAVED
    assert outcome.detail["saved_step"] is None
    line = ev.saved_line()
    assert "saved step" not in line and "resumes there" not in line
    assert line == (
        f"stopped after {STOP} training step(s) of this run without a checkpoint of it "
        "(0 of 2 rank(s) saved it): the "
        "next run starts from the last checkpoint the script wrote, if any (no rank "
        "reported a completed save)"
    )
    assert outcome.message == f"preempted: {line}"
    status = ev.status()
    assert status is not None and status.saved_step is None and status.saved == line


def test_an_older_save_is_where_the_next_run_starts() -> None:
    ev = _evaluator()
    _, ranks = _ended([(50, 50), (50, 50)])
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_NOT_SAVED
    assert ev.saved_line() == (
        f"stopped after {STOP} training step(s) of this run (script step {STOP}) without a "
        "checkpoint of it (0 of 2 rank(s) saved it): the next run starts from script step "
        "50, the last save every rank completed"
    )


def test_older_saves_of_different_steps() -> None:
    ev = _evaluator()
    _, ranks = _ended([(50, 50), (60, 60)])
    ev.evaluate(1.0, ranks)
    assert ev.saved_line().endswith(
        "the next run starts from the last save every rank completed, script step 50 at the "
        "latest (their last saves: script steps 50 to 60)"
    )


def test_one_rank_saved_the_other_did_not() -> None:
    ev = _evaluator()
    _, ranks = _ended([(STOP, STOP), None])
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_NOT_SAVED
    assert outcome.detail["ranks_saved"] == 1
    assert ev.saved_line() == (
        f"stopped after {STOP} training step(s) of this run (script step {STOP}) without a "
        "checkpoint of it (1 of 2 rank(s) saved it): the "
        "next run starts from the last checkpoint the script wrote, if any (1 of 2 rank(s) "
        "reported a completed save)"
    )
    status = ev.status()
    assert status is not None and status.saved_step is None and status.ranks_saved == 1


def test_one_rank_saved_the_stop_step_the_other_an_older_one() -> None:
    ev = _evaluator()
    _, ranks = _ended([(STOP, STOP), (50, 50)])
    ev.evaluate(1.0, ranks)
    assert ev.saved_line() == (
        f"stopped after {STOP} training step(s) of this run (script step {STOP}) without a "
        "checkpoint of it (1 of 2 rank(s) saved it): the "
        f"next run starts from the last save every rank completed, script step 50 at the "
        f"latest (their last saves: script steps 50 to {STOP})"
    )


def test_a_save_then_a_failed_exit_is_still_a_save() -> None:
    """The checkpoint was committed: a rank that then exits non-zero does not undo it."""
    ev = _evaluator()
    _, ranks = _ended([(STOP, STOP), (STOP, STOP)], clean=False)
    [outcome] = _outcome(ev.evaluate(1.0, ranks))
    assert outcome.reason is Reason.PREEMPTION_SAVED


def test_no_outcome_while_a_rank_runs() -> None:
    ev = _evaluator()
    rules = heartbeat_rules(2)
    saved = {"signal_received": True, "saved_step": STOP, "saved_seq": STOP}
    rules.ingest(heartbeat_record(0, event="process_end", preempt=saved), 1.0)
    rules.ingest(heartbeat_record(1, preempt={"signal_received": True}), 1.0)
    rules.evaluate(1.0)
    assert _outcome(ev.evaluate(1.0, rules.ranks)) == []
    assert ev.saved_line().startswith(
        f"stopped after {STOP} training step(s) of this run (script step {STOP}) without a "
        "checkpoint of it (1 of 2"
    )


def test_status_shows_the_line() -> None:
    ev = _evaluator()
    _, ranks = _ended([None, None])
    ev.evaluate(1.0, ranks)
    lines = _preemption_lines(ev.status())
    assert any(line.strip() == ev.saved_line() for line in lines), lines


@pytest.mark.parametrize(
    "block",
    [
        {"saved_step": 5},
        {"saved_seq": 5},
        {"saved_step": -1, "saved_seq": 5},
        {"saved_step": 5, "saved_seq": "5"},
        {"saved_step": True, "saved_seq": 5},
    ],
)
def test_a_malformed_save_is_refused(block: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"preempt\.saved_"):
        PreemptBlock.from_dict(block)


def test_a_malformed_save_counts_as_none() -> None:
    ev = _evaluator()
    rules = heartbeat_rules(1)
    bad = {"saved_step": STOP}  # no saved_seq
    rules.ingest(heartbeat_record(0, event="process_end", world_size=1, preempt=bad), 1.0)
    rules.evaluate(1.0)
    [outcome] = _outcome(ev.evaluate(1.0, rules.ranks))
    assert outcome.reason is Reason.PREEMPTION_NOT_SAVED


# ---- the rank's side ---------------------------------------------------------------------


def test_the_heartbeat_block_names_the_last_completed_save() -> None:
    tracker = ProgressTracker(mode="cpu")
    pre = RankPreemption(PreemptionConfig(enable_exit_handler=True), tracker)
    assert pre.heartbeat_block().saved_step is None
    for step in range(101, 104):  # a run resumed at step 100 numbers its steps
        tracker.step_end(step)
    tracker.checkpoint_start("step_103")
    tracker.note_saved(103)
    tracker.checkpoint_end()  # a save's end is progress, not a training step
    tracker.step_end(104)
    block = pre.heartbeat_block()
    assert (block.saved_step, block.saved_seq) == (103, 3)
    assert PreemptBlock.from_dict(block.to_dict()) == block


def _session(tmp_path: Path) -> Any:
    from rankguard.session import Session

    return Session(rank_identity(), tmp_path, heartbeat_config(), publish=False)


@pytest.fixture
def rank_preemption() -> Any:
    """The rank's preemption installed (as ``rankguard.init()`` does): the savers of
    ``rankguard.preempt`` note their saves on its step clock."""
    tracker = ProgressTracker(mode="cpu")
    pre = RankPreemption(PreemptionConfig(enable_exit_handler=True), tracker)
    assert pre.install()
    try:
        yield pre
    finally:
        pre.release()


def test_torch_file_saver_tells_the_rank(tmp_path: Path, rank_preemption: Any) -> None:
    tracker = rank_preemption.tracker
    for _ in range(4):
        tracker.step_end()
    saver = TorchFileSaver(tmp_path / "ckpt", 0, lambda: {"w": torch.zeros(1)})
    tracker.checkpoint_start("step_4")
    saver.save(4)
    tracker.checkpoint_end()
    assert tracker.saved == (4, 4)
    block = rank_preemption.heartbeat_block()
    assert (block.saved_step, block.saved_seq) == (4, 4)
    rank_preemption.release()
    saver.save(5)  # released: noted nowhere
    assert tracker.saved == (4, 4)


def test_save_and_wait_tells_the_rank_once_committed(rank_preemption: Any) -> None:
    tracker = rank_preemption.tracker
    tracker.step_end()
    tracker.step_end()
    seen: list[Any] = []

    class Async:
        def save(self, step: int) -> None:
            seen.append(("save", tracker.saved))

        def wait(self) -> None:
            seen.append(("wait", tracker.saved))

    save_and_wait(Async(), 2)
    assert seen == [("save", None), ("wait", None)]  # not saved before the commit
    assert tracker.saved == (2, 2)


def test_the_checkpoint_manager_tells_the_session_at_the_commit(tmp_path: Path) -> None:
    """An async save counts once committed, as of the steps at its call; a local-tier
    save is not what a requeued job (maybe on other nodes) can load."""
    from rankguard.checkpoint import CheckpointConfig, CheckpointManager

    session = _session(tmp_path)
    model = torch.nn.Linear(2, 2)
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=True)
    with CheckpointManager(config, {"model": model}, job_id="j", session=session) as m:
        for _ in range(3):
            session.step_end()
        m.save(3)
        session.step_end()  # the loop goes on while the write is in flight
        m.wait()
        assert session.tracker.saved == (3, 3)


def test_ranks_that_finished_training_before_the_stop_step_completed() -> None:
    """The signal came, but every rank (a script that asks should_stop) finished its
    loop and exited 0 before the stop step: no 'stopped at step N without a checkpoint
    of it', the job completed and there is nothing to resume."""
    ev = _evaluator()
    rules = heartbeat_rules(2)
    for rank in (0, 1):
        raw = heartbeat_record(
            rank,
            event="process_end",
            exit={"clean": True, "exit_code": 0},
            world_size=2,
            progress_seq=STOP - 2,
            iteration=100 + STOP - 2,
            iteration_source="script",
            preempt={"signal_received": True, "asks_stop": True},
        )
        rules.ingest(raw, 1.0)
    rules.evaluate(1.0)
    [outcome] = _outcome(ev.evaluate(1.0, rules.ranks))
    assert outcome.reason is Reason.PREEMPTION_AFTER_TRAINING
    line = (
        "the exit signal came, but every rank (2) finished training and exited 0 before the "
        f"agreed stop step (after {STOP} training step(s) of this run (script step "
        f"{100 + STOP})): the job completed, nothing to resume"
    )
    assert outcome.message == line == ev.saved_line()
    assert outcome.detail == {"stop_after_steps": STOP, "stop_script_step": 100 + STOP} | {
        "saved_step": None
    }
    status = ev.status()
    assert status.stop_at_step == STOP and status.stop_at_script_step == 100 + STOP


def test_a_resumed_run_says_the_stop_step_in_both_numberings() -> None:
    """A run resumed at script step 100: the stop step counts this run's training steps
    (75), the save and where the next run starts are the script's steps."""
    ev = _evaluator()
    _, ranks = _ended([(150, 50), (100 + STOP, STOP)])
    found = ev.evaluate(1.0, ranks)
    announce = next(f for f in found if f.reason is Reason.EXIT_SIGNAL)
    assert f"every rank stops after {STOP} training step(s) of this run (script step " in (
        announce.message
    )
    assert announce.iteration == 100 + STOP
    assert ev.saved_line() == (
        f"stopped after {STOP} training step(s) of this run (script step {100 + STOP}) "
        "without a checkpoint of it (1 of 2 rank(s) saved it): the next run starts from the "
        f"last save every rank completed, script step 150 at the latest (their last saves: "
        f"script steps 150 to {100 + STOP})"
    )
