"""Step times leave evaluation and saving out: a 7 s evaluation inside a window of 24 ms
steps must not read as a 727 ms step."""

from __future__ import annotations

import pytest

from rankguard.perf.config import PerfConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.timeline import ProgressTracker
from tests.factories import FakeNsClock


def _rig(**cfg: object) -> tuple[FakeNsClock, ProgressTracker, PerfReporter]:
    clock = FakeNsClock()
    tracker = ProgressTracker(clock=clock, mode="cpu")
    reporter = PerfReporter(
        PerfConfig(**cfg),  # type: ignore[arg-type]
        tracker,
        rank=1,
        world_size=2,
        run_id="run-1",
        out_dir=None,
    )
    reporter.set_flops(1e12, "test")
    return clock, tracker, reporter


def _steps(clock: FakeNsClock, tracker: ProgressTracker, n: int, ms: float = 24.0) -> None:
    for _ in range(n):
        clock.advance_ms(ms)
        tracker.step_end()


def test_recognised_eval_is_not_a_step() -> None:
    """Zero-code: the watcher saw the eval (a span between steps 4 and 5)."""
    clock, tracker, reporter = _rig(log_interval=10, warmup_iterations=0)
    _steps(clock, tracker, 4)
    clock.advance(3.5)
    tracker.add_span(clock.ns, clock.ns, "eval")  # one sample in the middle of it
    clock.advance(3.5)
    _steps(clock, tracker, 6)
    reporter.poll()
    window = reporter.entries[-1]
    assert window["step"] == 10
    assert window["step_time_ms"] == 24.0  # not (10 x 24 + 7000) / 10 = 724
    assert window["steps_in_window"] == 8  # 9 intervals, one held the eval
    summary = reporter.summary()
    assert summary["final_statistics"]["max_step_time_ms"] == 24.0
    assert summary["session_info"]["steps_with_eval_or_save"] == 1
    assert summary["session_info"]["total_iterations"] == 10
    # TFLOP/s from the step time, not from the eval-inflated interval
    expected = 1e12 / 0.024 / 2 / 1e12
    assert summary["final_statistics"]["avg_tflops_per_gpu"] == pytest.approx(expected, rel=1e-5)


def test_api_eval_and_recognised_save_are_left_out() -> None:
    clock, tracker, reporter = _rig(log_interval=5, warmup_iterations=0)
    tracker.set_phase("train")
    _steps(clock, tracker, 2)
    tracker.set_phase("eval")
    clock.advance(7)
    tracker.set_phase("train")
    _steps(clock, tracker, 3)
    reporter.poll()  # polled between steps, as the thread does
    clock.advance(2)
    tracker.add_span(clock.ns, clock.ns + 1, "checkpointing")
    clock.advance(2)
    _steps(clock, tracker, 5)
    reporter.poll()
    assert [e["step_time_ms"] for e in reporter.entries] == [24.0, 24.0, 24.0]
    assert reporter.excluded_steps == 2
