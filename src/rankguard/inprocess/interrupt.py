"""Reaching into the training thread from the watcher thread.

:class:`Liveness` — is the training thread running Python? The watcher asks the
interpreter to run a tiny callback on the main thread (``Py_AddPendingCall``, public C
API, through ctypes); the interpreter runs it only between two bytecodes of the main
thread, so its timestamp stops when the main thread is stuck in a blocked collective,
a blocking call or a CUDA synchronisation, and keeps moving during a long step of
ordinary Python. That is NVRx's definition of a hang, without a tracing hook on the hot
path: nothing runs in the training loop itself.

:class:`Interrupter` — stop what the training thread does and raise
:class:`RestartInterrupt` in it. On the main thread (the normal case) it sends a signal
of its own (``SIGRTMIN+4``) with ``pthread_kill``: the handler runs on the main thread
itself, so deciding whether to raise and raising are one step of that thread (no race
with the wrapper's own exception handling), and a blocking system call (``sleep``, a
queue ``get``) returns with ``EINTR`` so the handler runs at once. A call blocked inside
C++ (a collective) is released by aborting the communicator first; the handler runs when
it returns. On another thread (ranks as threads), ``PyThreadState_SetAsyncExc`` is the
only public way; it cannot wake a blocking call.

An interrupter is also the context manager of an *atomic* section (NVRx's
``CallWrapper.atomic``): an interrupt that comes while the training thread is inside one
is held and raised as the section ends, so a step's update (the optimizer step and the
state the next round resumes from) lands whole or not at all.

An interrupt that comes while the training thread is inside an ``import`` is not raised
there: an exception out of a module's top-level code leaves its submodules loaded and
the package half set up (a lazily imported ``torch._dynamo`` interrupted by a peer's
fault then failed every later round with "partially initialized module"). The handler
returns, the thread stays armed, and the watcher's next delivery (it delivers again
while the round is armed) raises once the import has finished.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["INTERRUPT_SIGNAL", "Interrupter", "Liveness", "RestartInterrupt"]

INTERRUPT_SIGNAL = signal.SIGRTMIN + 4  # stack dumps use SIGRTMIN+3; USR1/2 are the user's


class RestartInterrupt(BaseException):
    """Raised in the training thread to end its round: a peer failed, or this rank is
    stuck. A ``BaseException``, so ``except Exception`` in user code does not swallow it."""


_IMPORT_SYSTEM = ("importlib._bootstrap>", "importlib._bootstrap_external>")
_IMPORT_SYSTEM_FILES = ("importlib/_bootstrap.py", "importlib/_bootstrap_external.py")


def inside_import(frame: FrameType | None, boundary: Any = None) -> bool:
    """Is ``frame`` (a thread's innermost) inside the import system, between it and the
    frame running ``boundary`` (a code object: the wrapper's call of the user's function;
    the whole stack without one)? An import begun outside the round (a script whose
    top-level code runs the wrapped function) does not count."""
    while frame is not None:
        code = frame.f_code
        if code is boundary:
            return False
        name = code.co_filename
        if name.endswith(_IMPORT_SYSTEM) or name.endswith(_IMPORT_SYSTEM_FILES):
            return True
        frame = frame.f_back
    return False


_PendingCall = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class Liveness:
    """When did the main thread last run Python? (see the module docstring)"""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last = clock()
        self._add = ctypes.pythonapi.Py_AddPendingCall
        self._add.argtypes = (_PendingCall, ctypes.c_void_p)
        self._add.restype = ctypes.c_int
        self._callback = _PendingCall(self._ran)  # kept alive as long as self

    def _ran(self, _arg: Any) -> int:
        self.last = self._clock()
        return 0

    def ask(self) -> None:
        """Watcher thread: ask the main thread to stamp ``last`` at its next bytecode."""
        self._add(self._callback, None)

    def reset(self) -> None:
        self.last = self._clock()

    def idle_s(self) -> float:
        return self._clock() - self.last


class Interrupter:
    """Raise :class:`RestartInterrupt` in ``thread`` while it is armed.

    ``armed`` is set by the training thread around the user's function and the
    completion wait; the handler raises only while armed and disarms itself, so one
    delivery raises once. :meth:`fire` may be repeated (user code that swallowed the
    interrupt gets it again). ``with interrupter:`` is an atomic section (reentrant): an
    interrupt inside it is raised at its end; an exception leaving the section is left
    to propagate (the wrapper reports it) and the held interrupt is dropped."""

    def __init__(self, thread: threading.Thread | None = None) -> None:
        self.thread = thread or threading.current_thread()
        self.armed = False
        self.reason = ""
        self.deliveries = 0
        self._on_main = self.thread is threading.main_thread()
        self._previous: Any = None
        self._installed = False
        self.depth = 0  # atomic sections the training thread is in
        self.pending = False  # an interrupt came inside one
        self.boundary: Any = None  # the code object calling the user's function
        self.held_in_import = 0  # deliveries held because an import was running

    def arm(self) -> None:
        """Training thread, as a round starts: interrupts raise from now on."""
        self.pending = False
        self.armed = True

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.depth -= 1
        if self.depth == 0 and self.pending:
            self.pending = False
            if self.armed and exc_type is None:
                self.armed = False
                raise RestartInterrupt(self.reason)

    def install(self) -> None:
        """Training thread, at start: the signal handler (main thread only)."""
        if self._on_main and threading.current_thread() is self.thread:
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._handler)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(INTERRUPT_SIGNAL, self._previous or signal.SIG_DFL)
            self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed:
            if self.depth:  # inside an atomic section: raised at its end
                self.pending = True
                return
            if inside_import(frame, self.boundary):  # the next delivery raises it
                self.held_in_import += 1
                return
            self.armed = False
            raise RestartInterrupt(self.reason)

    def fire(self, reason: str) -> None:
        """Watcher thread: interrupt the training thread (if armed)."""
        if not self.armed:
            return
        self.reason = reason
        self.deliveries += 1
        ident = self.thread.ident
        if ident is None:
            return
        if self._installed:
            signal.pthread_kill(ident, INTERRUPT_SIGNAL)
            return
        if self.depth:  # the section's end raises it (a thread entering one just now
            self.pending = True  # may still get it inside: no signal to order them)
            return
        if inside_import(sys._current_frames().get(ident), self.boundary):
            self.held_in_import += 1  # the next delivery (the thread may have moved on)
            return
        set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
        set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)
        set_async.restype = ctypes.c_int
        self.armed = False
        if set_async(ident, RestartInterrupt) > 1:  # never more than one thread
            set_async(ident, None)
