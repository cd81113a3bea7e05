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
  holding it, it holds the training up. Most of the writer's time is in calls that let
  go of the lock (the copy into the aligned buffer, the write calls, zlib); the rest is
  short, and the training thread waiting for the lock leaves its core to the writer.

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

__all__ = ["IdleOutcome", "IdleWindow", "restore_permitted"]


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
    """A short thread of its own lowered to ``SCHED_IDLE`` and raised back, both by the
    caller (by the thread's id: the kernel checks the permission against the thread
    changed, not the one changing it); True if both took. The probe thread only waits:
    the answer never depends on a thread in ``SCHED_IDLE`` getting a core, which on a
    node whose cores the training keeps busy took seconds (a wrong False past a wait)."""
    release = threading.Event()
    thread = threading.Thread(
        target=release.wait, args=(60.0,), name="rankguard-prio-probe", daemon=True
    )
    thread.start()
    tid = thread.native_id
    assert tid is not None
    try:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            return False
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            return False  # the probe thread ends in SCHED_IDLE: it starves nothing
        return True
    finally:
        release.set()


@functools.cache
def restore_permitted() -> bool:
    """Whether a thread of this process may be lowered to ``SCHED_IDLE`` and raised
    back (asked once, on a short thread of its own)."""
    return _probe()


class IdleWindow:
    """Context manager: the calling thread in ``SCHED_IDLE`` until the block ends or
    ``max_s`` seconds have passed, whichever is first; then back to its policy.

    The bound is kept by a thread started before the lowering (a thread inherits its
    creator's policy: it keeps the caller's). The caller lowers itself (it goes on
    running: no wake-up to wait for in ``SCHED_IDLE``) holding a lock the bound thread
    waits for, and the bound counts from the lowering: a lowering late by any time (the
    caller preempted before it on a loaded node) cannot come after the bound's raise
    and leave the thread in ``SCHED_IDLE`` for the rest of the write. ``outcome`` and
    ``idle_s`` tell what happened once the block has ended."""

    def __init__(self, max_s: float, *, permitted: bool | None = None) -> None:
        assert max_s > 0, max_s
        self.max_s = max_s
        self._permitted = permitted
        self.outcome = IdleOutcome.NOT_PERMITTED
        self.idle_s = 0.0
        self._lock = threading.Lock()
        self._tid = 0
        self._policy = 0
        self._param: os.sched_param | None = None
        self._lowered = False
        self._ended = False  # no lowering from now on
        self._t0 = 0.0
        self._stop = threading.Event()  # the block has ended: no bound to keep

    def __enter__(self) -> IdleWindow:
        permitted = restore_permitted() if self._permitted is None else self._permitted
        if not permitted:
            return self
        self._tid = threading.get_native_id()
        self._policy = os.sched_getscheduler(self._tid)
        self._param = os.sched_getparam(self._tid)
        bound = threading.Thread(target=self._keep_bound, name="rankguard-idle-bound", daemon=True)
        with self._lock:  # the bound thread reads the lowering's time once it is set
            bound.start()  # before the lowering: the bound thread keeps the caller's policy
            if self._ended:
                return self
            os.sched_setscheduler(self._tid, os.SCHED_IDLE, os.sched_param(0))
            self._t0 = time.monotonic()  # after the lowering: idle_s >= max_s if bound
            self._lowered = True
            self.outcome = IdleOutcome.IDLE
        return self

    def _keep_bound(self) -> None:
        """The bound thread: the caller back to its policy ``max_s`` after its lowering."""
        with self._lock:
            if not self._lowered:
                return
            t0 = self._t0
        if not self._stop.wait(max(0.0, t0 + self.max_s - time.monotonic())):
            self._restore(IdleOutcome.BOUNDED)

    def end(self) -> None:
        """From any thread: the thread back to its policy now (the training waits for
        the write: yielding to it only makes the wait longer)."""
        self._restore(IdleOutcome.WAITED)

    def _restore(self, why: IdleOutcome | None = None) -> None:
        with self._lock:
            self._ended = True
            if not self._lowered:
                return
            self._lowered = False
            self.idle_s = time.monotonic() - self._t0
            assert self._param is not None
            os.sched_setscheduler(self._tid, self._policy, self._param)
            if why is not None:
                self.outcome = why

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._restore()
