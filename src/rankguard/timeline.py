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
checkpoint end advances and restores the previous phase; an end without a start is a
no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CHECKPOINT_PHASE", "RING_SIZE", "ProgressSnapshot", "ProgressTracker", "cuda_in_use"]

CHECKPOINT_PHASE = "checkpointing"
RING_SIZE = 8192  # step-end times kept for the performance monitor (power of two)
_RING_MASK = RING_SIZE - 1


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


class ProgressTracker:
    __slots__ = (
        "_clock",
        "_event_factory",
        "_events",
        "_mode",
        "_next_event",
        "_pending",
        "_queued_iteration",
        "_queued_seq",
        "_saved_phase",
        "_started_ns",
        "_stream",
        "checkpoint_active",
        "checkpoint_durations_ns",
        "checkpoint_id",
        "checkpoint_started_ns",
        "data_at",
        "data_ns",
        "iteration",
        "last_progress_ns",
        "non_step_seqs",
        "on_change",
        "phase",
        "phase_ns",
        "progress_seq",
        "source",
        "started_ns",
        "step_ns",
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
        self.progress_seq = 0
        self.iteration: int | None = None
        self.phase = "setup"
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
        self.phase_ns = self._started_ns  # when the phase last changed

    # ---- hot path -------------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        """One training step has been issued. No I/O, no sync."""
        mode = self._mode
        if mode is None:
            mode = self._mode = "cuda" if cuda_in_use() else "cpu"
        now = self._clock()
        if mode == "cpu":
            seq = self.progress_seq + 1
            self.step_ns[seq & _RING_MASK] = now
            self.data_at[seq & _RING_MASK] = self.data_ns
            self.iteration = seq if iteration is None else iteration
            self.last_progress_ns = now
            self.progress_seq = seq
            return
        if self._stream is None:
            self._stream = _current_stream()
        seq = self._queued_seq + 1
        self.step_ns[seq & _RING_MASK] = now
        self.data_at[seq & _RING_MASK] = self.data_ns
        self._queued_iteration = seq if iteration is None else iteration
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
        if phase != self.phase:
            if self.checkpoint_active:
                self._saved_phase = phase
                return
            self.phase = phase
            self.phase_ns = self._clock()
            self._changed()

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        if self.checkpoint_active:
            self.checkpoint_id = checkpoint_id
            return
        self._saved_phase = self.phase
        self.checkpoint_id = checkpoint_id
        self.checkpoint_active = True
        self.phase = CHECKPOINT_PHASE
        self.checkpoint_started_ns = self.phase_ns = self._clock()
        self._changed()

    def checkpoint_end(self) -> None:
        if not self.checkpoint_active:
            return
        self.checkpoint_active = False
        self.phase = self._saved_phase or "train"
        self._saved_phase = None
        self.phase_ns = self._clock()
        now = self.last_progress_ns = self._clock()
        # A finished save is progress; on GPU it counts as one more issued step, so
        # the events of later steps still move progress forward.
        if self._mode == "cuda":
            self._queued_seq = max(self._queued_seq, self.progress_seq) + 1
            seq = self.progress_seq = self._queued_seq
        else:
            seq = self.progress_seq = self.progress_seq + 1
        self.step_ns[seq & _RING_MASK] = now
        self.data_at[seq & _RING_MASK] = self.data_ns
        self.non_step_seqs.append(seq)
        self.checkpoint_durations_ns.append(now - self.checkpoint_started_ns)
        self._changed()

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

    def snapshot(self) -> ProgressSnapshot:
        now = self._clock()
        last = self.last_progress_ns
        since_ns = now - (last if last is not None else self._started_ns)
        return {
            "progress_seq": self.progress_seq,
            "iteration": self.iteration,
            "phase": self.phase,
            "checkpoint_active": self.checkpoint_active,
            "checkpoint_id": self.checkpoint_id,
            "last_progress_monotonic_ns": last,
            "since_progress_s": round(since_ns / 1e9, 6),
            "phase_elapsed_s": round((now - self.phase_ns) / 1e9, 6),
            "progress_source": self.source,
            "monotonic_ns": now,
        }
