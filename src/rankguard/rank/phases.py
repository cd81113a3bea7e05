"""Evaluation and checkpoint saving recognised without code, from the main thread's stack.

A script that never tells rankguard its phase is in ``setup`` until its first step and in
``train`` after it (:meth:`rankguard.rank.timeline.ProgressTracker.effective_phase`). While it
is in ``setup`` or ``train`` (nanoGPT evaluates at iteration 0, before its first step:
that is an evaluation too), the heartbeat thread (at each record) and the perf thread (at each poll)
look at the main thread's Python stack (``sys._current_frames()``, the same sample the
heartbeat's ``main_frame`` evidence comes from) and name the phase from the functions on
it: ``torch.save`` or ``Trainer._save_checkpoint`` on the stack is ``checkpointing``,
nanoGPT's ``estimate_loss`` or ``Trainer.evaluate`` is ``eval``. Nothing runs on the
training thread.

Patterns are matched against a frame's qualified name, ``module.qualname`` (for example
``transformers.trainer.Trainer.evaluate``, ``__main__.estimate_loss``; on Python 3.10,
which has no ``co_qualname``, ``module.function``). In a pattern ``*`` matches within one
dotted part and ``**.`` any number of leading parts (``**.evaluate`` is a function or
method named ``evaluate`` in any module). The stack is walked from the innermost frame
out, at most :data:`MAX_DEPTH` frames; the first frame whose first matching pattern names
a phase decides; a pattern whose phase is ``none`` marks frames that never do (torch's
own functions are ``none`` after the few torch save functions, so that ``Module.eval``
never reads as an evaluation). The verdict is cached per code object: a sample costs
one dictionary lookup per frame (``bench/phase_sampling.py``).

Users add patterns with ``heartbeat.phase_patterns`` (pattern -> phase), checked before
the built-in table; see ``docs/heartbeat.md``. The gradient mode (``torch.no_grad``) is
thread-local state of the training thread, invisible from another thread, so it is not a
signal here.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Mapping
from types import CodeType, FrameType
from typing import Any

from rankguard.rank.timeline import (
    CHECKPOINT_PHASE,
    EVAL_PHASE,
    SETUP_PHASE,
    TRAIN_PHASE,
    ProgressTracker,
)

_SAMPLED = (SETUP_PHASE, TRAIN_PHASE)  # the phases a recognised one takes over

__all__ = [
    "BUILTIN_PATTERNS",
    "MAX_DEPTH",
    "NO_PHASE",
    "PhaseMatcher",
    "PhaseWatcher",
    "check_patterns",
    "main_thread_frame",
    "thread_frame",
]

MAX_DEPTH = 200  # frames walked per sample (HF Trainer's deepest eval stacks are ~80)
NO_PHASE = "none"  # a pattern's phase: frames that never decide a phase
_MAX_CACHE = 50_000  # code objects remembered (a program has far fewer on its stacks)

# Ordered: the first pattern that matches a frame decides that frame.
BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    # checkpoint saving
    ("torch.serialization.save", CHECKPOINT_PHASE),
    ("torch.distributed.checkpoint.**.save", CHECKPOINT_PHASE),
    ("torch.distributed.checkpoint.**.async_save", CHECKPOINT_PHASE),
    ("torch.distributed.checkpoint.**.save_state_dict", CHECKPOINT_PHASE),
    ("torch.**", NO_PHASE),  # torch's own code: never a phase by its name
    ("safetensors.**.save_file", CHECKPOINT_PHASE),
    ("safetensors.**.save_model", CHECKPOINT_PHASE),
    ("safetensors.**.save", CHECKPOINT_PHASE),
    ("**._save_checkpoint", CHECKPOINT_PHASE),  # HF Trainer, Lightning ModelCheckpoint
    ("**.save_checkpoint", CHECKPOINT_PHASE),  # Lightning, Megatron, DeepSpeed, scripts
    ("**.save_model", CHECKPOINT_PHASE),  # HF Trainer
    ("transformers.trainer_callback.**.on_save", CHECKPOINT_PHASE),  # after-save callbacks
    ("transformers.generation.**", NO_PHASE),  # GenerationConfig.validate: not a validation
    # evaluation
    ("lightning.pytorch.loops.evaluation_loop.**", EVAL_PHASE),
    ("lightning.pytorch.loops.prediction_loop.**", EVAL_PHASE),
    ("pytorch_lightning.loops.evaluation_loop.**", EVAL_PHASE),
    ("pytorch_lightning.loops.prediction_loop.**", EVAL_PHASE),
    ("**.evaluation_loop", EVAL_PHASE),  # HF Trainer
    ("**.prediction_step", EVAL_PHASE),  # HF Trainer
    ("**.estimate_loss", EVAL_PHASE),  # nanoGPT
    ("**.evaluate", EVAL_PHASE),
    ("**.evaluate_*", EVAL_PHASE),
    ("**.evaluation", EVAL_PHASE),
    ("**.eval", EVAL_PHASE),
    ("**.eval_*", EVAL_PHASE),
    ("**.run_eval*", EVAL_PHASE),
    ("**.validate", EVAL_PHASE),
    ("**.validate_model", EVAL_PHASE),
    ("**.validate_epoch", EVAL_PHASE),
    ("**.validation*", EVAL_PHASE),
    ("**.run_validation*", EVAL_PHASE),
)

_PATTERN_TEXT = re.compile(r"[A-Za-z0-9_.*<>]+")
_PHASE_TEXT = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_patterns(patterns: Mapping[str, str]) -> None:
    """``ValueError`` naming the first bad user pattern or phase (config validation)."""
    for pattern, phase in patterns.items():
        if not isinstance(pattern, str) or not _PATTERN_TEXT.fullmatch(pattern):
            raise ValueError(
                f"phase_patterns: pattern {pattern!r} must be a dotted name with * or ** "
                "wildcards (letters, digits, _ . * < >), e.g. '**.run_eval' or "
                "'mypkg.ckpt.save_all'"
            )
        if (
            not isinstance(phase, str)
            or not _PHASE_TEXT.fullmatch(phase)
            or phase
            in (
                "setup",
                TRAIN_PHASE,
            )
        ):
            raise ValueError(
                f"phase_patterns.{pattern}: phase must be eval, checkpointing, none or "
                f"another lower-case name (not setup or train), got {phase!r}"
            )


def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**.", i):
            out.append(r"(?:.*\.)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append(r"[^.]*")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


class PhaseMatcher:
    """The phase a stack shows, by the first matching pattern of its innermost deciding
    frame; verdicts cached per code object."""

    def __init__(
        self, patterns: Mapping[str, str] | None = None, *, max_depth: int = MAX_DEPTH
    ) -> None:
        user = dict(patterns or {})
        check_patterns(user)
        table = [*user.items(), *BUILTIN_PATTERNS]
        self._table = [(_compile(p), None if phase == NO_PHASE else phase) for p, phase in table]
        self._cache: dict[int, tuple[CodeType, str | None]] = {}
        self.max_depth = max_depth

    def classify(self, module: str, qualname: str) -> str | None:
        """The phase a function marks (None: it does not)."""
        name = f"{module}.{qualname}"
        for regex, phase in self._table:
            if regex.fullmatch(name):
                return phase
        return None

    def _frame_phase(self, frame: FrameType) -> str | None:
        code = frame.f_code
        module = frame.f_globals.get("__name__")
        qualname = getattr(code, "co_qualname", code.co_name)
        return self.classify(module if isinstance(module, str) else "?", qualname)

    def phase_of(self, frame: FrameType | None) -> str | None:
        """Walk from ``frame`` outwards; the first frame that names a phase decides."""
        cache = self._cache
        depth = self.max_depth
        while frame is not None and depth:
            code = frame.f_code
            # keyed by id(): hashing a code object hashes its bytecode and constants,
            # every time; the entry keeps its code object, so an id is never reused
            entry = cache.get(id(code))
            if entry is None or entry[0] is not code:
                if len(cache) >= _MAX_CACHE:
                    cache.clear()
                entry = cache[id(code)] = (code, self._frame_phase(frame))
            if entry[1] is not None:
                return entry[1]
            frame = frame.f_back
            depth -= 1
        return None


def thread_frame(thread: threading.Thread | None = None) -> FrameType | None:
    """The innermost Python frame of ``thread`` (None: the main thread, the training
    thread of a script), from another thread (None on that thread itself, or when it has
    none: not started, or ended)."""
    thread = thread or threading.main_thread()
    if thread is threading.current_thread() or thread.ident is None:
        return None
    return sys._current_frames().get(thread.ident)


def main_thread_frame() -> FrameType | None:
    """The main thread's innermost Python frame, from another thread (None on the main
    thread itself, or when it has none)."""
    return thread_frame(None)


class PhaseWatcher:
    """The rank's phase as the monitor should see it: the tracker's phase, except that in
    ``setup`` or ``train`` a recognised evaluation or save on the main thread's stack
    takes over.

    Called by the heartbeat and perf threads (thread-safe). Each sample that sees a
    recognised phase extends its span in the tracker's ``phase_spans`` (first and last
    sample that saw it), which the performance monitor leaves out of the step times.
    """

    def __init__(
        self,
        tracker: ProgressTracker,
        patterns: Mapping[str, str] | None = None,
        *,
        training_thread: threading.Thread | None = None,
    ) -> None:
        """``training_thread``: the thread whose stack is sampled (None: the main
        thread)."""
        self.tracker = tracker
        self.training_thread = training_thread
        self.matcher = PhaseMatcher(patterns)
        self._lock = threading.Lock()
        self._open: list[Any] | None = None  # the span of the phase seen at the last sample
        self._train_since = 0  # when train resumed after a recognised phase (sample time)
        self.samples = 0

    def observe(self, frame: FrameType | None = None) -> tuple[str, int]:
        """The phase now and when it began (monotonic ns of the tracker's clock). Samples
        the training thread's stack itself unless given its ``frame``."""
        with self._lock:
            tracker = self.tracker
            phase, since = tracker.effective_phase()
            now = tracker.now_ns()
            detected = None
            if phase in _SAMPLED and not tracker.checkpoint_active:
                if frame is None:
                    frame = thread_frame(self.training_thread)
                detected = self.matcher.phase_of(frame)
                self.samples += 1
            span = self._open
            if detected is not None:
                if span is not None and span[2] == detected:
                    span[1] = now
                else:
                    span = self._open = tracker.add_span(now, now, detected)
                return detected, span[0]
            if span is not None:  # the recognised phase ended since the last sample
                self._open = None
                self._train_since = now
            if phase in _SAMPLED and self._train_since > since:
                since = self._train_since
            return phase, since

    def fields(self, frame: FrameType | None = None) -> dict[str, Any]:
        """``phase`` and ``phase_elapsed_s`` for a heartbeat record."""
        phase, since = self.observe(frame)
        return {
            "phase": phase,
            "phase_elapsed_s": round(max(0, self.tracker.now_ns() - since) / 1e9, 6),
        }
