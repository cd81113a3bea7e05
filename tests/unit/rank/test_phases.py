"""Phases without code: the pattern table, the stack walk, the watcher's spans, and the
tracker's implicit train phase."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from rankguard.config import ConfigError, load_config
from rankguard.monitor.config import HeartbeatConfig
from rankguard.rank.phases import BUILTIN_PATTERNS, PhaseMatcher, PhaseWatcher, check_patterns
from rankguard.rank.timeline import ProgressTracker
from tests.factories import FakeNsClock


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("torch.serialization.save", "checkpointing"),
        ("torch.distributed.checkpoint.state_dict_saver.save", "checkpointing"),
        ("torch.distributed.checkpoint.state_dict_saver.async_save", "checkpointing"),
        ("torch.distributed.checkpoint.state_dict_loader.load", None),
        ("safetensors.torch.save_file", "checkpointing"),
        ("transformers.trainer.Trainer._save_checkpoint", "checkpointing"),
        ("transformers.trainer.Trainer.save_model", "checkpointing"),
        ("lightning.pytorch.trainer.trainer.Trainer.save_checkpoint", "checkpointing"),
        ("megatron.training.checkpointing.save_checkpoint", "checkpointing"),
        ("transformers.trainer.Trainer.evaluate", "eval"),
        ("transformers.trainer.Trainer.evaluation_loop", "eval"),
        ("transformers.trainer.Trainer.prediction_step", "eval"),
        ("transformers.trainer.evaluate", "eval"),  # Python 3.10: no co_qualname
        ("lightning.pytorch.loops.evaluation_loop._EvaluationLoop.run", "eval"),
        ("pytorch_lightning.loops.evaluation_loop._EvaluationLoop.run", "eval"),
        ("__main__.estimate_loss", "eval"),
        ("__main__.main.<locals>.evaluate", "eval"),
        ("__main__.eval_epoch", "eval"),
        ("mypkg.loop.validation_step", "eval"),
        ("__main__.validate", "eval"),
        # never phases
        ("torch.nn.modules.module.Module.eval", None),
        ("torch._dynamo.eval_frame._fn", None),
        ("transformers.trainer.Trainer._maybe_log_save_evaluate", None),
        ("transformers.trainer.Trainer.training_step", None),
        ("__main__.train_and_evaluate_all", None),
        ("__main__.validate_args", None),
        ("transformers.generation.configuration_utils.GenerationConfig.validate", None),
        ("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop.advance", None),
    ],
)
def test_builtin_table(name: str, phase: str | None) -> None:
    module, _, qualname = name.partition(".")
    if name.startswith("__main__."):
        module, qualname = "__main__", name[len("__main__.") :]
    else:
        parts = name.split(".")
        # module = everything before the first capitalised part or the last part
        cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts) - 1)
        module, qualname = ".".join(parts[:cut]), ".".join(parts[cut:])
    assert PhaseMatcher().classify(module, qualname) == phase


def test_user_patterns_come_first_and_none_silences() -> None:
    m = PhaseMatcher({"**.estimate_loss": "none", "mypkg.*.dump_all": "checkpointing"})
    assert m.classify("__main__", "estimate_loss") is None
    assert m.classify("mypkg.io", "dump_all") == "checkpointing"
    assert m.classify("mypkg.io.deep", "dump_all") is None  # * stays in one dotted part
    assert m.classify("__main__", "evaluate") == "eval"  # the built-in table still applies


@pytest.mark.parametrize(
    ("patterns", "match"),
    [
        ({"a b": "eval"}, "pattern 'a b'"),
        ({"**.x": "train"}, r"phase_patterns\.\*\*\.x: phase"),
        ({"**.x": "Eval"}, "phase must be"),
        ({"": "eval"}, "pattern ''"),
    ],
)
def test_bad_patterns_are_refused(patterns: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_patterns(patterns)


def test_patterns_from_the_command_line_and_eval_timeout_rules() -> None:
    cfg = load_config(
        None, ["heartbeat.phase_patterns=**.run_bench:eval,mypkg.io.dump:checkpointing"]
    )
    assert cfg.heartbeat.phase_patterns == {
        "**.run_bench": "eval",
        "mypkg.io.dump": "checkpointing",
    }
    with pytest.raises(ConfigError, match=r"heartbeat\.phase_patterns"):
        load_config(None, ["heartbeat.phase_patterns=**.x:train"])
    with pytest.raises(ConfigError, match=r"heartbeat\.eval_timeout_s: must be >= progress"):
        load_config(None, ["heartbeat.eval_timeout_s=100", "heartbeat.progress_timeout_s=200"])
    assert HeartbeatConfig().eval_timeout_s == 1800.0


def test_stack_walk_innermost_decides_and_is_bounded() -> None:
    def estimate_loss(inner: Callable[[], FrameType]) -> FrameType:
        return inner()

    def save_checkpoint() -> FrameType:
        return sys._getframe()

    m = PhaseMatcher()
    frame = estimate_loss(save_checkpoint)
    assert m.phase_of(frame) == "checkpointing"
    assert m.phase_of(frame.f_back) == "eval"  # estimate_loss's own frame

    def deep(n: int) -> FrameType:
        return deep(n - 1) if n else sys._getframe()

    frame = estimate_loss(lambda: deep(30))
    assert m.phase_of(frame) == "eval"
    assert PhaseMatcher(max_depth=10).phase_of(frame) is None  # walk bounded


class _MainLike:
    """A thread that parks in a given function, standing in for the training thread."""

    def __init__(self, park: Callable[[threading.Event, threading.Event], None]) -> None:
        self.ready, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=park, args=(self.ready, self.release))
        self.thread.start()
        assert self.ready.wait(5)

    def frame(self) -> FrameType:
        ident = self.thread.ident
        assert ident is not None
        return sys._current_frames()[ident]

    def stop(self) -> None:
        self.release.set()
        self.thread.join(5)


def estimate_loss(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(5)


def training_step(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(5)


def test_watcher_spans_and_the_clock_after_a_recognised_phase() -> None:
    clock = FakeNsClock()
    tracker = ProgressTracker(clock=clock, mode="cpu")
    watcher = PhaseWatcher(tracker)
    evaluating, training = _MainLike(estimate_loss), _MainLike(training_step)
    try:
        # nanoGPT's evaluation at iteration 0, before its first step, is an evaluation
        t_early = clock.ns
        assert watcher.observe(evaluating.frame()) == ("eval", t_early)
        clock.advance(1)
        back = clock.ns
        assert watcher.observe(training.frame()) == ("setup", back)  # setup's clock restarts
        tracker.step_end()
        first_step = clock.ns
        assert watcher.observe(training.frame()) == ("train", first_step)
        clock.advance(2)
        t_eval = clock.ns
        assert watcher.observe(evaluating.frame()) == ("eval", t_eval)
        clock.advance(3)
        assert watcher.observe(evaluating.frame()) == ("eval", t_eval)
        assert tracker.phase_spans == [[t_early, t_early, "eval"], [t_eval, clock.ns, "eval"]]
        clock.advance(1)
        resumed = clock.ns
        assert watcher.observe(training.frame()) == ("train", resumed)
        fields = watcher.fields(training.frame())
        assert fields == {"phase": "train", "phase_elapsed_s": 0.0}
        # an interval that held the eval is not a step; one after it is
        assert tracker.interval_in_other_phase(first_step, resumed)
        assert not tracker.interval_in_other_phase(resumed, resumed + 10)
        assert tracker.interval_in_other_phase(0, first_step)  # it held the early eval
        # the API's phases win over the stack
        tracker.set_phase("my_section")
        assert watcher.observe(evaluating.frame())[0] == "my_section"
    finally:
        evaluating.stop()
        training.stop()


def test_tracker_train_after_the_first_step_unless_a_phase_was_set() -> None:
    clock = FakeNsClock()
    t = ProgressTracker(clock=clock, mode="cpu")
    assert t.snapshot()["phase"] == "setup"
    clock.advance(5)
    t.step_end()
    clock.advance(2)
    snap: dict[str, Any] = t.snapshot()
    assert snap["phase"] == "train" and snap["phase_elapsed_s"] == 2.0
    assert t.phase == "setup"  # derived by the reader: the hot path did not change
    explicit = ProgressTracker(clock=clock, mode="cpu")
    explicit.set_phase("setup")
    explicit.step_end()
    assert explicit.snapshot()["phase"] == "setup"


def test_api_phases_leave_exact_spans() -> None:
    clock = FakeNsClock()
    t = ProgressTracker(clock=clock, mode="cpu")
    t.set_phase("train")
    clock.advance(1)
    start = clock.ns
    t.set_phase("eval")
    clock.advance(7)
    t.set_phase("train")
    assert t.phase_spans == [[start, clock.ns, "eval"]]


def test_builtin_table_is_ordered_torch_first() -> None:
    names = [p for p, _ in BUILTIN_PATTERNS]
    assert names.index("torch.serialization.save") < names.index("torch.**")
    assert names.index("torch.**") < names.index("**.eval")
