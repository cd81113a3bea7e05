"""The step timeline: the only rankguard code on the training hot path.

Shared infrastructure, not the heartbeat's: the heartbeat publisher, the performance
monitor, fault tolerance's section statistics and the straggler probe all read its
counters and its ring buffer of step ends.

:meth:`ProgressTracker.step_end` runs once per step in the training loop. It does no
I/O, takes no lock, makes no CUDA call and never synchronises the device: it bumps
counters and reads the monotonic clock. On GPU, "progress" means the GPU finished the
step's work, not that Python queued it: the heartbeat thread (:meth:`poll`) records a
CUDA event on the training thread's stream, after everything queued so far, remembers
how many steps had been issued then, and counts them as progress once ``query()`` says
the event completed. One event is in flight at a time, so progress catches up with
every issued step within two polls of the GPU finishing it, even if training then
blocks.

The tracker has one writer (the training thread) and one reader (the heartbeat thread).
Every field is a plain attribute whose assignment is atomic under the GIL; the reader
takes a snapshot and tolerates seeing a step in flight.

Progress rules (FlagScale's, kept): setting a phase never advances progress; a step end
does; checkpoint start switches to the ``checkpointing`` phase without advancing;
checkpoint end advances and restores the previous phase (a wait for a background write
ends without advancing: it saved nothing); an end without a start is a no-op.

Phases without code: a script that never sets a phase is in ``setup`` until its first
step and in ``train`` from then on (:meth:`ProgressTracker.effective_phase`, derived by
the readers, nothing on the hot path). Evaluation and checkpoint saving are recognised
by the heartbeat and perf threads sampling the main thread's stack
(:mod:`rankguard.rank.phases`); both they and :meth:`set_phase` leave the spans of phases
other than ``train`` in :attr:`ProgressTracker.phase_spans`, so the performance monitor
and the section statistics can leave a step interval that contained one out of the
step times (:meth:`ProgressTracker.interval_in_other_phase`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "CHECKPOINT_PHASE",
    "CLOSING_PHASE",
    "EVAL_PHASE",
    "ITERATION_SOURCES",
    "RING_SIZE",
    "SETUP_PHASE",
    "TRAIN_PHASE",
    "ProgressSnapshot",
    "ProgressTracker",
    "cuda_in_use",
]

CHECKPOINT_PHASE = "checkpointing"
#: After the script's main returned: the session closes (the perf monitor's last writes,
#: the trackers' flush). Judged by ``checkpoint_timeout_s``, not the step's timeout.
CLOSING_PHASE = "closing"
EVAL_PHASE = "eval"
SETUP_PHASE = "setup"
TRAIN_PHASE = "train"
#: The phase a rank reports while it re-enters in-process (the monitor gives it the hard
#: timeout, or the barrier's while a lost peer's standby is on its way).
RESTART_PHASE = "inprocess_restart"
MAX_SPANS = 1024  # spans of non-train phases kept (the perf monitor reads the recent ones)
#: Where a heartbeat's ``iteration`` comes from (:meth:`ProgressTracker.shown_iteration`).
ITERATION_SOURCES = ("script", "checkpoint", "steps", "none")
RING_SIZE = 8192  # step-end times kept for the performance monitor (power of two)
_RING_MASK = RING_SIZE - 1
assert _RING_MASK == 8191, "step_end and optimizer_step_hook spell the mask as a literal"


class _Event(Protocol):
    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...


def cuda_in_use() -> bool:
    """CUDA is available and this process has initialised it (a GPU rank)."""
    try:
        import torch  # here, not at the top: `import rankguard` (light commands) stays torch-free

        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


def _current_stream() -> Any:
    try:
        import torch  # here, not at the top: see cuda_in_use

        return torch.cuda.current_stream()
    except Exception:
        return None


def _cuda_event() -> _Event:
    import torch  # here, not at the top: see cuda_in_use

    return torch.cuda.Event()


ProgressSnapshot = dict[str, Any]


def _no_lead() -> None:
    """No optimizer leads yet (optimizer_step_hook's lead before the first step)."""
    return None


class ProgressTracker:
    __slots__ = (
        "_clock",
        "_event_factory",
        "_events",
        "_lead",
        "_mode",
        "_next_event",
        "_pending",
        "_phase_set",
        "_queued_iteration",
        "_queued_seq",
        "_resumed_at",
        "_saved_phase",
        "_started_ns",
        "_stream",
        "_train_ns",
        "checkpoint_active",
        "checkpoint_count",
        "checkpoint_durations_ns",
        "checkpoint_id",
        "checkpoint_started_ns",
        "data_at",
        "data_ns",
        "iteration",
        "iteration_given",
        "last_progress_ns",
        "non_step_seqs",
        "on_change",
        "phase",
        "phase_ns",
        "phase_spans",
        "progress_seq",
        "resumed_step",
        "saved",
        "source",
        "started_ns",
        "step_ns",
        "stopped_at",
    )

    def __init__(
        self,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        event_factory: Callable[[], _Event] | None = None,
        mode: str | None = None,
    ) -> None:
        """``mode``: ``"cpu"``, ``"cuda"`` or None to decide at the first step (CUDA when
        the process has initialised CUDA by then). ``event_factory`` replaces
        ``torch.cuda.Event`` (tests use a fake)."""
        self._clock = clock
        self._started_ns = clock()
        self._mode = mode
        self._event_factory = event_factory or _cuda_event
        self._events: list[_Event] = []
        self._next_event = 0
        self._pending: tuple[_Event, int, int | None] | None = None
        self._stream: Any = None
        self._queued_seq = 0
        self._queued_iteration: int | None = None
        self._saved_phase: str | None = None
        # the optimizer whose steps count (optimizer_step_hook), held weakly
        self._lead: Callable[[], object] = _no_lead
        self.progress_seq = 0
        self.iteration: int | None = None
        # Where the shown iteration comes from (see shown_iteration): the script numbers
        # its steps (a step end was given one), and the step of the checkpoint this
        # process resumed from (set by the checkpoint library's load).
        self.iteration_given = False
        self.resumed_step: int | None = None
        self._resumed_at = 0
        # The training steps this process had issued when it left at a stop request
        # (should_stop() said stop, or the script left after the preemption signal):
        # its process_end says so, so the launcher tells a stop from a finished run.
        self.stopped_at: int | None = None
        # The last completed save a next run can load: (the script's step, the training
        # steps this process had issued when its state was taken). One tuple: written by
        # a background commit, read by the heartbeat thread.
        self.saved: tuple[int, int] | None = None
        self.phase = SETUP_PHASE
        self._phase_set = False  # has anyone set a phase (API, checkpoint)?
        self._train_ns = 0  # readers: when the implicit train phase began (first step)
        self.checkpoint_active = False
        self.checkpoint_id: str | None = None
        self.checkpoint_started_ns = 0
        self.checkpoint_durations_ns: list[int] = []
        self.last_progress_ns: int | None = None
        self.source = "none"
        self.on_change: Callable[[], None] | None = None
        # Timeline shared with the performance monitor: step_ns[n & mask] is when step
        # n was issued (monotonic ns); data_ns the total time in data loading.
        self.started_ns = self._started_ns
        self.step_ns = [0] * RING_SIZE
        self.data_ns = 0
        self.data_at = [0] * RING_SIZE  # data_ns when step n ended
        self.non_step_seqs: list[int] = []  # progress counted for a checkpoint, not a step
        self.checkpoint_count = 0  # saves ended: progress_seq - this = training steps
        self.phase_ns = self._started_ns  # when the phase last changed
        # [start_ns, end_ns, phase] of phases other than setup/train: from set_phase
        # (exact) and from stack sampling (first and last sample that saw the phase)
        self.phase_spans: list[list[Any]] = []

    # ---- hot path -------------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        """One training step has been issued. No I/O, no sync.

        Written for the cost next to a real ``opt.step()`` (``bench/hot_path.py``): one
        clock read, locals instead of repeated attribute loads, the ring's mask as a
        literal, the CPU case first."""
        now = self._clock()
        if self._mode == "cpu":
            seq = self.progress_seq + 1
            slot = seq & 8191  # _RING_MASK
            self.step_ns[slot] = now
            self.data_at[slot] = self.data_ns
            if iteration is None:
                self.iteration = seq
            else:  # the script numbers its steps (one more store, only then)
                self.iteration = iteration
                self.iteration_given = True
            self.last_progress_ns = now
            self.progress_seq = seq
            return
        self._step_end_slow(now, iteration)

    def optimizer_step_hook(self, optimizer: object, args: object, kwargs: object) -> None:
        """``register_optimizer_step_post_hook``'s callable, itself the step end (one call
        per optimizer step, not two). With several optimizers only the first one that
        steps (the lead) counts, so one iteration is one progress step. The lead is
        compared by identity through a weak reference: no ``id()`` integer made per step,
        and the tracker does not keep the script's optimizer alive."""
        if self._lead() is not optimizer and not self._take_lead(optimizer):
            return
        now = self._clock()
        if self._mode == "cpu":
            seq = self.progress_seq + 1
            slot = seq & 8191  # _RING_MASK
            self.step_ns[slot] = now
            self.data_at[slot] = self.data_ns
            self.iteration = seq
            self.last_progress_ns = now
            self.progress_seq = seq
            return
        self._step_end_slow(now, None)

    def leads(self, optimizer: object) -> bool:
        """Whether ``optimizer``'s steps are the progress (the lead, as the hook counts
        them): for a hook that wraps the step end (the straggler probe's)."""
        return self._lead() is optimizer or self._take_lead(optimizer)

    def _take_lead(self, optimizer: object) -> bool:
        """The first optimizer that steps leads; False for any other while the lead
        lives. Once the lead is gone (a script, or an in-process restart's new round,
        that builds a new optimizer), the next optimizer that steps leads: its steps are
        the progress, not a silence the monitor would take for a hang."""
        if self._lead() is not None:
            return False
        try:
            self._lead = weakref.ref(optimizer)
        except TypeError:  # no weak references to it: kept as long as the tracker

            def strong() -> object:
                return optimizer

            self._lead = strong
        return True

    def _step_end_slow(self, now: int, iteration: int | None) -> None:
        """The first step (mode not decided yet) and every step of a GPU rank."""
        mode = self._mode
        if mode is None:
            mode = self._mode = "cuda" if cuda_in_use() else "cpu"
            if mode == "cpu":
                self.step_end(iteration)
                return
        if self._stream is None:
            self._stream = _current_stream()
        seq = self._queued_seq + 1
        self.step_ns[seq & _RING_MASK] = now
        self.data_at[seq & _RING_MASK] = self.data_ns
        if iteration is None:
            self._queued_iteration = seq
        else:
            self._queued_iteration = iteration
            self.iteration_given = True
        self._queued_seq = seq

    @property
    def issued_seq(self) -> int:
        """Steps issued by the training thread (on CPU: completed)."""
        return self._queued_seq if self._mode == "cuda" else self.progress_seq

    @property
    def issued_iteration(self) -> int | None:
        """The script's iteration number of the last issued step."""
        return self._queued_iteration if self._mode == "cuda" else self.iteration

    @property
    def mode(self) -> str | None:
        return self._mode

    @property
    def stream(self) -> Any:
        return self._stream

    def now_ns(self) -> int:
        return self._clock()

    # ---- rare calls (not per step) -------------------------------------------------

    def set_phase(self, phase: str) -> None:
        self._phase_set = True
        if phase != self.phase:
            if self.checkpoint_active:
                self._saved_phase = phase
                return
            old, now = self.phase, self._clock()
            if old not in (SETUP_PHASE, TRAIN_PHASE):
                self.add_span(self.phase_ns, now, old)
            self.phase = phase
            self.phase_ns = now
            self._changed()

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        if self.checkpoint_active:
            self.checkpoint_id = checkpoint_id
            return
        # the phase to come back to: a script that never set one is in train after its
        # first step (effective_phase), not in setup
        self._saved_phase = self.effective_phase()[0]
        self._phase_set = True
        self.checkpoint_id = checkpoint_id
        self.checkpoint_active = True
        self.phase = CHECKPOINT_PHASE
        self.checkpoint_started_ns = self.phase_ns = self._clock()
        self._changed()

    def checkpoint_end(self, progress: bool = True) -> None:
        """End the checkpoint phase and go back to the phase before it. ``progress``:
        the save's end counts as progress; False for a wait that saved nothing (a wait
        for a background write): its time is left out of the step times as a span."""
        if not self.checkpoint_active:
            return
        self.checkpoint_active = False
        self.phase = self._saved_phase or "train"
        self._saved_phase = None
        self.phase_ns = self._clock()
        if not progress:
            self.add_span(self.checkpoint_started_ns, self.phase_ns, CHECKPOINT_PHASE)
            self._changed()
            return
        now = self.last_progress_ns = self._clock()
        # A finished save is progress; on GPU it counts as one more issued step, so
        # the events of later steps still move progress forward. It is listed as a save
        # and its slot written before its progress is published: the perf thread, which
        # reads the published count first, never takes it for a step.
        if self._mode == "cuda":
            seq = max(self._queued_seq, self.progress_seq) + 1
        else:
            seq = self.progress_seq + 1
        self.step_ns[seq & _RING_MASK] = now
        self.data_at[seq & _RING_MASK] = self.data_ns
        self.non_step_seqs.append(seq)
        if self._mode == "cuda":
            self._queued_seq = seq
        self.progress_seq = seq
        self.checkpoint_count += 1
        self.checkpoint_durations_ns.append(now - self.checkpoint_started_ns)
        self._changed()

    def add_span(self, start_ns: int, end_ns: int, phase: str) -> list[Any]:
        """Record a span of a phase other than train (the list is kept short)."""
        span = [start_ns, end_ns, phase]
        spans = self.phase_spans
        spans.append(span)
        if len(spans) > 2 * MAX_SPANS:
            del spans[:-MAX_SPANS]
        return span

    def note_resumed(self, step: int) -> None:
        """This process resumed from the checkpoint of step ``step``: without the
        script's own numbering, the shown iteration is that step plus the steps since."""
        self.resumed_step = int(step)
        self._resumed_at = self._steps_counted()  # an in-process restart resumes again

    def note_saved(self, step: int, seq: int | None = None) -> None:
        """A save of the script's step ``step`` completed (committed: a next run can
        load it). ``seq``: the training steps this process had issued when the save's
        state was taken (default: now), the numbering of an agreed stop step."""
        self.saved = (int(step), self.training_steps() if seq is None else int(seq))

    def training_steps(self) -> int:
        """Training steps issued so far (saves left out): what an agreed stop step counts."""
        return max(0, self.issued_seq - self.checkpoint_count)

    def mark_recovered(self) -> None:
        """An in-process restart brought the rank back: the time since progress starts
        again (the re-entry is not a stall); no step is counted."""
        self.last_progress_ns = self._clock()
        self._changed()

    def _changed(self) -> None:
        callback = self.on_change
        if callback is not None:
            callback()

    # ---- heartbeat thread -----------------------------------------------------------

    def poll(self) -> None:
        """Heartbeat thread, GPU only: turn a completed event into progress, then mark
        the steps issued since with a new event. Never blocks."""
        if self._mode != "cuda":
            return
        pending = self._pending
        if pending is not None:
            event, seq, iteration = pending
            if not event.query():
                return
            if seq > self.progress_seq:
                self.iteration = iteration
                self.last_progress_ns = self._clock()
                self.progress_seq = seq
            self._pending = None
        iteration = self._queued_iteration  # read before the count: may lag, never lead
        issued = self._queued_seq
        if issued > self.progress_seq:
            if not self._events:
                self._events = [self._event_factory(), self._event_factory()]
            event = self._events[self._next_event]
            self._next_event ^= 1
            # Recorded after everything the training thread queued before it read
            # ``issued``: completion means those steps are done.
            if self._stream is not None:
                event.record(self._stream)
            else:
                event.record()
            self._pending = (event, issued, iteration)

    # ---- readers (heartbeat and perf threads) ----------------------------------------

    def effective_phase(self) -> tuple[str, int]:
        """The phase and when it began (monotonic ns). A script that never set a phase
        is in ``train`` from its first step on (then since that step)."""
        phase = self.phase
        if phase == SETUP_PHASE and not self._phase_set and self.issued_seq > 0:
            began = self._train_ns
            if not began:
                began = self._train_ns = self.step_ns[1] or self._clock()
            return TRAIN_PHASE, began
        return phase, self.phase_ns

    def interval_in_other_phase(self, start_ns: int, end_ns: int) -> bool:
        """Did a phase other than train (a span in :attr:`phase_spans`) overlap the
        interval (``start_ns``, ``end_ns``)? Then it is not a step time."""
        for span in reversed(self.phase_spans):
            if span[1] <= start_ns:
                if span[0] <= start_ns:
                    break  # spans are in time order of their start: nothing earlier overlaps
                continue
            if span[0] < end_ns:
                return True
        return False

    def shown_iteration(self) -> tuple[int | None, str]:
        """The iteration to show and where it comes from (:data:`ITERATION_SOURCES`):

        - ``script``: the number the script (or its framework: HF ``global_step``,
          Lightning ``global_step``) passed to ``step_end``/``step``;
        - ``checkpoint``: the step of the checkpoint this process resumed from plus the
          training steps it made since;
        - ``steps``: the training steps this process counted (optimizer steps or
          ``step_end`` calls; checkpoint saves are not counted), not the script's numbering;
        - ``none``: no step yet.
        """
        iteration = self.iteration
        resumed = self.resumed_step
        if iteration is None:
            return (None, "none") if resumed is None else (resumed, "checkpoint")
        if self.iteration_given:
            return iteration, "script"
        steps = self._steps_counted()
        if resumed is not None:
            return resumed + max(0, steps - self._resumed_at), "checkpoint"
        return steps, "steps"

    def _steps_counted(self) -> int:
        """Training steps so far: progress counts a save's end too, which is no step."""
        return max(0, self.progress_seq - self.checkpoint_count)

    def snapshot(self) -> ProgressSnapshot:
        now = self._clock()
        last = self.last_progress_ns
        since_ns = now - (last if last is not None else self._started_ns)
        phase, phase_ns = self.effective_phase()
        iteration, iteration_source = self.shown_iteration()
        return {
            "progress_seq": self.progress_seq,
            "checkpoint_count": self.checkpoint_count,
            "iteration": iteration,
            "iteration_source": iteration_source,
            "phase": phase,
            "checkpoint_active": self.checkpoint_active,
            "checkpoint_id": self.checkpoint_id,
            "last_progress_monotonic_ns": last,
            "since_progress_s": round(since_ns / 1e9, 6),
            "phase_elapsed_s": round((now - phase_ns) / 1e9, 6),
            "progress_source": self.source,
            "monotonic_ns": now,
        }
