"""An async save's write in the training process, at the priority that leaves the
cores to the training for at most a bounded time: :class:`IdleWindow`.

DCP's thread writer (``async_checkpointer_type: thread``) is a thread of the training
process, started for each save. At the training's priority it takes a core's share
from the training for as long as it writes; with the training's intra-op threads on
every core, a core taken from one of them holds up each parallel operator, and the
steps beside the write ran up to twice as long on 2 cores. In Linux's ``SCHED_IDLE``
class it runs when a core would otherwise idle. Two risks, both bounded here:

- a training that leaves no gap (or other processes keeping every core busy) would
  starve the write: after ``max_s`` seconds the thread goes back to the policy it had,
  so the write finishes at the training's priority;
- the thread shares the interpreter lock with the training thread: descheduled while
  holding it, it holds the training up until a core is free for it, which on a node
  that other processes keep busy can take long. A window opened with
  ``gil_aware=True`` is the thread's :func:`current_window`: the writer's file
  (:class:`~rankguard.checkpoint.writer.DigestFile`) raises the thread back to its
  policy (:meth:`IdleWindow.hold`) whenever it runs Python, which needs the lock, and
  lowers it (:meth:`IdleWindow.lower`) only around the calls that let go of the lock
  (the copy into the aligned buffer, the write calls, zlib) and after each ``torch.save``
  record, where torch computes the next record's CRC-32 without the lock. The bulk of
  the write's CPU stays in ``SCHED_IDLE``; what holds the lock runs at the training's
  priority (microseconds at a time).

Going back to a normal policy from ``SCHED_IDLE`` needs ``CAP_SYS_NICE`` or an
``RLIMIT_NICE`` that allows it: where neither holds the thread is never lowered (a
write that could not be brought back could starve for good); :func:`restore_permitted`
tells which.
"""

from __future__ import annotations

import enum
import functools
import os
import threading
import time
from types import TracebackType

__all__ = ["IdleOutcome", "IdleWindow", "current_window", "restore_permitted"]

_current = threading.local()  # the gil-aware window open on this thread


class IdleOutcome(str, enum.Enum):
    """How a write's idle window ended: ``IDLE`` the whole write in ``SCHED_IDLE``;
    ``BOUNDED`` back to the thread's policy after ``max_s`` (the training left too few
    gaps); ``WAITED`` back to it when the training stopped to wait for the write (no
    gap left to yield to: :meth:`IdleWindow.end`); ``NOT_PERMITTED`` never lowered
    (see :func:`restore_permitted`)."""

    IDLE = "idle"
    BOUNDED = "bounded"
    WAITED = "waited"
    NOT_PERMITTED = "not_permitted"


def _probe() -> bool:
    """On a thread of its own: lowered to ``SCHED_IDLE`` and back; True if both took."""
    ok: list[bool] = []

    def run() -> None:
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            ok.append(False)
            return
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            ok.append(True)
        except OSError:
            ok.append(False)  # the probe thread ends here: it starves nothing

    thread = threading.Thread(target=run, name="rankguard-prio-probe", daemon=True)
    thread.start()
    thread.join(timeout=5.0)
    return bool(ok and ok[0])


def current_window() -> IdleWindow | None:
    """The ``gil_aware`` window open on the calling thread, if any."""
    window: IdleWindow | None = getattr(_current, "window", None)
    return window


@functools.cache
def restore_permitted() -> bool:
    """Whether a thread of this process may be lowered to ``SCHED_IDLE`` and raised
    back (asked once, on a short thread of its own)."""
    return _probe()


class IdleWindow:
    """Context manager: the calling thread in ``SCHED_IDLE`` until the block ends or
    ``max_s`` seconds have passed, whichever is first; then back to its policy.

    The bound is kept by a timer thread started before the lowering (a thread inherits
    its creator's policy: the timer keeps the caller's). ``outcome`` and
    ``idle_s`` (how long the window was open) tell what happened once the block has
    ended. While the window is open the thread may go back to its policy and down
    again (:meth:`hold`, :meth:`lower`); once it is closed (the block's end, the bound,
    :meth:`end`) it stays at its policy."""

    def __init__(
        self, max_s: float, *, permitted: bool | None = None, gil_aware: bool = False
    ) -> None:
        assert max_s > 0, max_s
        self.max_s = max_s
        self._permitted = permitted
        self.gil_aware = gil_aware
        self.outcome = IdleOutcome.NOT_PERMITTED
        self.idle_s = 0.0
        self._lock = threading.Lock()
        self._tid = 0
        self._policy = 0
        self._param: os.sched_param | None = None
        self._open = False  # lowering allowed (between the lowering and the close)
        self._lowered = False
        self._t0 = 0.0
        self._timer: threading.Timer | None = None

    def __enter__(self) -> IdleWindow:
        permitted = restore_permitted() if self._permitted is None else self._permitted
        if not permitted:
            return self
        self._tid = threading.get_native_id()
        self._policy = os.sched_getscheduler(self._tid)
        self._param = os.sched_getparam(self._tid)
        timer = threading.Timer(self.max_s, self._restore, args=(IdleOutcome.BOUNDED,))
        timer.daemon = True
        timer.name = "rankguard-idle-bound"
        self._t0 = time.monotonic()  # before the timer's start: idle_s >= max_s if bound
        timer.start()  # before the lowering: the timer keeps the caller's policy
        self._timer = timer
        os.sched_setscheduler(self._tid, os.SCHED_IDLE, os.sched_param(0))
        self._open = self._lowered = True
        self.outcome = IdleOutcome.IDLE
        if self.gil_aware:
            _current.window = self
        return self

    def hold(self) -> None:
        """On the window's thread: back to its policy, the window kept open (the
        thread runs Python: it holds the interpreter lock)."""
        if self._lowered:
            with self._lock:
                if self._lowered:
                    assert self._param is not None
                    os.sched_setscheduler(self._tid, self._policy, self._param)
                    self._lowered = False

    def lower(self) -> None:
        """On the window's thread: in ``SCHED_IDLE`` again while the window is open
        (next: a call that lets go of the interpreter lock)."""
        if self._open and not self._lowered:
            with self._lock:
                if self._open and not self._lowered:
                    os.sched_setscheduler(self._tid, os.SCHED_IDLE, os.sched_param(0))
                    self._lowered = True

    def end(self) -> None:
        """From any thread: the thread back to its policy now (the training waits for
        the write: yielding to it only makes the wait longer)."""
        self._restore(IdleOutcome.WAITED)

    def _restore(self, why: IdleOutcome | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
            self.idle_s = time.monotonic() - self._t0
            if self._lowered:
                assert self._param is not None
                os.sched_setscheduler(self._tid, self._policy, self._param)
                self._lowered = False
            if why is not None:
                self.outcome = why

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if getattr(_current, "window", None) is self:
            del _current.window
        self._restore()
