"""ProgressTracker: FlagScale's progress rules, CUDA-event confirmation, snapshot ages."""

from __future__ import annotations

import pytest

from rankguard.rank.timeline import CHECKPOINT_PHASE, ProgressTracker
from tests.factories import FakeNsClock as FakeClock


class FakeEvent:
    """Stands in for torch.cuda.Event: ``done`` says whether the GPU reached it."""

    def __init__(self) -> None:
        self.records = 0
        self.done = False
        self.queries = 0

    def record(self, stream: object = None) -> None:
        self.records += 1
        self.done = False

    def query(self) -> bool:
        self.queries += 1
        return self.done


class EventFactory:
    def __init__(self) -> None:
        self.created: list[FakeEvent] = []

    def __call__(self) -> FakeEvent:
        event = FakeEvent()
        self.created.append(event)
        return event

    @property
    def total_records(self) -> int:
        return sum(e.records for e in self.created)

    def recorded(self) -> list[FakeEvent]:
        return [e for e in self.created if e.records and not e.done]


def _cpu(clock: FakeClock | None = None) -> ProgressTracker:
    return ProgressTracker(clock=clock or FakeClock(), mode="cpu")


def _cuda(clock: FakeClock | None = None) -> tuple[ProgressTracker, EventFactory]:
    factory = EventFactory()
    return ProgressTracker(clock=clock or FakeClock(), event_factory=factory, mode="cuda"), factory


def test_initial_state() -> None:
    t = _cpu()
    assert t.progress_seq == 0
    assert t.iteration is None
    assert t.phase == "setup"
    assert t.checkpoint_active is False
    assert t.last_progress_ns is None
    assert t.source == "none"


def test_set_phase_never_advances_progress() -> None:
    t = _cpu()
    for phase in ("train", "eval", "my_phase", "train", "setup"):
        t.set_phase(phase)
        assert t.phase == phase
        assert t.progress_seq == 0
        assert t.last_progress_ns is None


def test_step_end_advances_progress_and_iteration() -> None:
    clock = FakeClock()
    t = _cpu(clock)
    clock.advance(2)
    t.step_end()
    assert t.progress_seq == 1 and t.iteration == 1
    assert t.last_progress_ns == clock.ns
    t.step_end()
    assert t.progress_seq == 2 and t.iteration == 2


def test_explicit_iteration_is_kept() -> None:
    t = _cpu()
    t.step_end(100)
    assert t.progress_seq == 1 and t.iteration == 100
    t.step_end(105)
    assert t.progress_seq == 2 and t.iteration == 105
    t.step_end(0)
    assert t.progress_seq == 3 and t.iteration == 0


def test_checkpoint_start_changes_phase_without_progress() -> None:
    t = _cpu()
    t.set_phase("train")
    t.step_end()
    t.checkpoint_start("ckpt_1")
    assert t.phase == CHECKPOINT_PHASE == "checkpointing"
    assert t.checkpoint_active is True
    assert t.checkpoint_id == "ckpt_1"
    assert t.progress_seq == 1


def test_checkpoint_end_advances_and_restores_phase() -> None:
    clock = FakeClock()
    t = _cpu(clock)
    t.set_phase("eval")
    t.checkpoint_start("c")
    clock.advance(30)
    t.checkpoint_end()
    assert t.phase == "eval"
    assert t.checkpoint_active is False
    assert t.progress_seq == 1
    assert t.last_progress_ns == clock.ns
    assert t.iteration is None  # a checkpoint is not an iteration


def test_a_wait_that_saved_nothing_ends_without_progress_and_leaves_a_span() -> None:
    """A wait for a background write (``checkpoint_end(progress=False)``): back to the
    phase before, no progress, no save counted; its time is a span, so the step interval
    around it is no step time."""
    clock = FakeClock()
    t = _cpu(clock)
    t.set_phase("train")
    t.step_end()
    calls: list[int] = []
    t.on_change = lambda: calls.append(1)
    clock.advance(1)
    start = clock.ns
    t.checkpoint_start("wait:step_1")
    clock.advance(5)
    t.checkpoint_end(progress=False)
    assert t.phase == "train" and t.checkpoint_active is False
    assert t.progress_seq == 1 and t.checkpoint_count == 0 and t.non_step_seqs == []
    assert t.phase_spans[-1] == [start, clock.ns, CHECKPOINT_PHASE]
    assert t.interval_in_other_phase(start - 1, clock.ns + 1)
    assert calls == [1, 1]  # published at start and end


def test_checkpoint_in_a_script_that_never_set_a_phase_returns_to_train() -> None:
    """Zero-code progress (optimizer hook) puts a script in train after its first step;
    a save then must come back to train, not to the setup it never left explicitly
    (else setup's timeout applies to training from then on)."""
    clock = FakeClock()
    t = _cpu(clock)
    assert t.effective_phase()[0] == "setup"
    t.step_end()
    clock.advance(1)
    assert t.effective_phase()[0] == "train"
    t.checkpoint_start(None)
    clock.advance(2)
    t.checkpoint_end()
    assert t.phase == "train" and t.effective_phase()[0] == "train"
    t.step_end()
    assert t.effective_phase()[0] == "train"


def test_checkpoint_before_the_first_step_returns_to_setup() -> None:
    t = _cpu()
    t.checkpoint_start(None)
    t.checkpoint_end()
    assert t.phase == "setup"


def test_checkpoint_end_without_start_changes_nothing() -> None:
    calls: list[int] = []
    t = _cpu()
    t.set_phase("train")
    t.on_change = lambda: calls.append(1)
    before = t.snapshot()
    t.checkpoint_end()
    after = t.snapshot()
    assert after == before
    assert calls == []


def test_nested_checkpoint_start_keeps_original_phase() -> None:
    t = _cpu()
    t.set_phase("train")
    t.checkpoint_start("a")
    t.checkpoint_start("b")
    assert t.checkpoint_id == "b"
    t.checkpoint_end()
    assert t.phase == "train"
    assert t.progress_seq == 1
    t.checkpoint_end()  # the second end has no start left
    assert t.progress_seq == 1


def test_set_phase_during_checkpoint_applies_after_end() -> None:
    t = _cpu()
    t.set_phase("train")
    t.checkpoint_start("c")
    t.set_phase("eval")
    assert t.phase == "checkpointing"
    t.checkpoint_end()
    assert t.phase == "eval"


def test_on_change_for_phase_and_checkpoint_not_for_steps() -> None:
    calls: list[str] = []
    t = _cpu()
    t.on_change = lambda: calls.append(t.phase)
    t.step_end()
    t.step_end()
    assert calls == []
    t.set_phase("train")
    t.set_phase("train")  # unchanged: no call
    assert calls == ["train"]
    t.checkpoint_start("c")
    t.step_end()
    t.checkpoint_end()
    assert calls == ["train", "checkpointing", "train"]


def test_snapshot_uses_injected_clock() -> None:
    clock = FakeClock()
    t = _cpu(clock)
    clock.advance(3.5)
    snap = t.snapshot()
    assert snap["since_progress_s"] == pytest.approx(3.5)  # since start
    assert snap["last_progress_monotonic_ns"] is None
    assert snap["monotonic_ns"] == clock.ns
    t.step_end(7)
    clock.advance(1.25)
    snap = t.snapshot()
    assert snap["since_progress_s"] == pytest.approx(1.25)
    assert snap["progress_seq"] == 1 and snap["iteration"] == 7
    assert set(snap) == {
        "progress_seq",
        "checkpoint_count",
        "iteration",
        "iteration_source",
        "phase",
        "checkpoint_active",
        "checkpoint_id",
        "last_progress_monotonic_ns",
        "since_progress_s",
        "progress_source",
        "phase_elapsed_s",
        "monotonic_ns",
    }


def test_auto_mode_is_cpu_without_cuda() -> None:
    factory = EventFactory()
    t = ProgressTracker(clock=FakeClock(), event_factory=factory)
    t.step_end()
    assert t.progress_seq == 1
    assert factory.created == []


# ---- CUDA mode with a fake event ------------------------------------------------------


def test_cuda_step_end_makes_no_cuda_call_and_progress_waits_for_the_event() -> None:
    clock = FakeClock()
    t, factory = _cuda(clock)
    t.step_end(10)
    assert factory.created == []  # the hot path never touches CUDA
    assert t.progress_seq == 0  # queued on the GPU only
    t.poll()  # the heartbeat thread marks the issued steps with an event
    assert t.progress_seq == 0  # event not reached yet
    (event,) = factory.recorded()
    t.poll()
    assert t.progress_seq == 0
    event.done = True
    assert t.progress_seq == 0  # nothing changes until the heartbeat thread polls
    clock.advance(2)
    t.poll()
    assert t.progress_seq == 1
    assert t.iteration == 10
    assert t.last_progress_ns == clock.ns


def test_cuda_one_event_outstanding_at_a_time() -> None:
    t, factory = _cuda()
    for i in range(1, 101):
        t.step_end(i)
    t.poll()
    for i in range(101, 201):
        t.step_end(i)
        t.poll()  # pending and not reached: no new record
    assert factory.total_records == 1
    (first,) = factory.recorded()
    first.done = True
    t.poll()  # confirms steps 1..100, then marks 101..200
    assert t.progress_seq == 100 and t.iteration == 100
    assert factory.total_records == 2
    (second,) = factory.recorded()
    second.done = True
    t.poll()
    assert t.progress_seq == 200 and t.iteration == 200
    t.poll()  # nothing new issued: nothing recorded
    assert factory.total_records == 2
    assert len(factory.created) == 2  # events are reused, never re-created


def test_cuda_poll_without_pending_event_is_noop() -> None:
    t, factory = _cuda()
    t.poll()
    assert t.progress_seq == 0
    assert factory.created == []


def test_cuda_phase_and_checkpoint_rules_hold() -> None:
    t, factory = _cuda()
    t.set_phase("train")
    assert t.progress_seq == 0
    t.checkpoint_start("c")
    t.checkpoint_end()
    assert t.progress_seq == 1 and t.phase == "train"
    assert factory.created == []


def test_cuda_progress_eventually_covers_every_completed_step() -> None:
    t, factory = _cuda()
    t.step_end(1)
    t.poll()  # event for step 1
    t.step_end(2)  # issued while step 1's event is pending; then training blocks
    for _ in range(3):
        for e in factory.created:
            e.done = True  # the GPU finishes whatever was queued
        t.poll()
    assert t.progress_seq == 2
    assert t.iteration == 2


def test_cuda_step_after_checkpoint_counts() -> None:
    t, factory = _cuda()
    t.step_end(1)
    t.poll()
    factory.recorded()[0].done = True
    t.poll()
    assert t.progress_seq == 1
    t.checkpoint_start("c")
    t.checkpoint_end()
    assert t.progress_seq == 2
    t.step_end(2)
    t.poll()
    (pending,) = factory.recorded()
    pending.done = True
    t.poll()
    assert t.iteration == 2
    assert t.progress_seq == 3


def test_saves_are_counted_apart_from_steps() -> None:
    t = _cpu(FakeClock())
    t.step_end()
    t.checkpoint_start("a")
    t.checkpoint_end()
    t.step_end()
    snap = t.snapshot()
    # a save is progress (FlagScale's rule) but not a training step
    assert snap["progress_seq"] == 3 and snap["checkpoint_count"] == 1


# ---- the iteration shown and its source ---------------------------------------------


def test_iteration_is_the_scripts_when_it_numbers_its_steps() -> None:
    t = _cpu()
    assert t.shown_iteration() == (None, "none")
    t.step_end(500)
    t.checkpoint_start()
    t.checkpoint_end()
    t.step_end(501)
    assert t.shown_iteration() == (501, "script")
    assert t.snapshot()["iteration_source"] == "script"


def test_counted_steps_leave_checkpoint_saves_out_and_say_so() -> None:
    t = _cpu()
    for _ in range(3):
        t.optimizer_step_hook(object, (), {})
    t.checkpoint_start()
    t.checkpoint_end()  # progress, but no step
    t.optimizer_step_hook(object, (), {})
    assert t.progress_seq == 5
    assert t.shown_iteration() == (4, "steps")
    snap = t.snapshot()
    assert (snap["iteration"], snap["iteration_source"]) == (4, "steps")


def test_a_resumed_checkpoints_step_plus_the_steps_since() -> None:
    t = _cpu()
    t.note_resumed(1500)
    assert t.shown_iteration() == (1500, "checkpoint")
    for _ in range(500):
        t.step_end()
    assert t.shown_iteration() == (2000, "checkpoint")
    t.note_resumed(1800)  # an in-process restart resumed again: counted from there
    t.step_end()
    assert t.shown_iteration() == (1801, "checkpoint")


def test_the_scripts_numbering_wins_over_a_resumed_step() -> None:
    t = _cpu()
    t.note_resumed(1500)
    t.step_end(1501)
    assert t.shown_iteration() == (1501, "script")


def test_a_save_after_the_last_step_does_not_take_a_step_off() -> None:
    t = _cpu()
    t.note_resumed(27)
    for _ in range(3):
        t.step_end()
    t.checkpoint_start()
    t.checkpoint_end()  # the save of step 30, after it
    assert t.shown_iteration() == (30, "checkpoint")
