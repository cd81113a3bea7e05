"""A wake-up a signal handler may give: one byte into a pipe, no lock.

``threading.Event.set()`` takes a non-reentrant lock; a signal handler runs on the main
thread between two bytecodes, possibly while that same thread is inside ``set()`` (a
failure callback wakes the relay too), and would wait on the lock for ever. A
:class:`Wakeup` is a non-blocking pipe instead: :meth:`Wakeup.set` is one ``os.write``
(a full pipe already wakes the waiter), :meth:`Wakeup.wait` a ``select`` with a timeout
that empties the pipe.
"""

from __future__ import annotations

import contextlib
import os
import select

__all__ = ["Wakeup"]


class Wakeup:
    """Wake one waiting thread; safe to :meth:`set` from a signal handler."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending
            os.write(self._w, b"\0")

    def wait(self, timeout_s: float) -> bool:
        """Until :meth:`set` (or ``timeout_s``); True when woken. Clears the wake-up."""
        try:
            ready, _, _ = select.select([self._r], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):  # closed
            return False
        woken = bool(ready)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._r, 4096):
                pass
        return woken

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()
