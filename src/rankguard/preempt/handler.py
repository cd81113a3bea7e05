"""The rank's exit-signal handler: it only sets a flag.

Installed on the main thread only (Python runs signal handlers there), it records that
the exit signal came and calls nothing else but an optional ``on_signal`` callback that
must itself only set flags. :meth:`ExitSignalHandler.release` puts the previous handler
back, unless someone replaced ours since (theirs is then left alone).

A script that never asks whether to stop (``listening`` false: a zero-code script, or
the signal before the loop's first question) gets the previous handler's behaviour:
the signal means what it meant before rankguard (by default, the process ends). A flag
nobody reads would only keep the rank running to the end of the grace window.

:func:`ignore_exit_signal` is the DataLoader ``worker_init_fn``: worker processes ignore
the exit signal, so a signal sent to the whole process group (Slurm signals every
process of a job step) cannot kill one mid-batch, which the rank would see as
``RuntimeError: DataLoader worker (pid N) is killed by signal: Terminated``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from rankguard.preempt.config import parse_exit_signal
from rankguard.rank.runenv import RunEnv, current

__all__ = ["ExitSignalHandler", "exit_signal_from_env", "ignore_exit_signal"]


class ExitSignalHandler:
    """Catch ``sig`` (SIGTERM by default) on the main thread; :attr:`received` is the flag."""

    def __init__(
        self,
        sig: signal.Signals = signal.SIGTERM,
        *,
        on_signal: Callable[[int], None] | None = None,
    ) -> None:
        self.sig = sig
        self.on_signal = on_signal
        self.received = False  # the flag
        self.count = 0  # how many times it came (a second signal changes nothing)
        self.listening = False  # the loop asks should_stop(): the flag is read
        self._previous: Any = None
        self._installed = False

    def install(self) -> bool:
        """Install on the main thread; False (nothing done) on any other thread."""
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return False
        self._previous = signal.signal(self.sig, self._handle)
        self._installed = True
        return True

    def release(self) -> None:
        """Restore the previous handler (main thread; only if ours is still the one)."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._installed = False
        if signal.getsignal(self.sig) == self._handle:
            signal.signal(self.sig, self._previous)

    @property
    def installed(self) -> bool:
        return self._installed

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.listening:
            self._fall_through(signum, frame)
            return
        self.received = True
        self.count += 1
        if self.on_signal is not None:
            self.on_signal(signum)

    def _fall_through(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL or previous is None:
            self.release()
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        # SIG_IGN: ignored, as before


def exit_signal_from_env(env: RunEnv | None = None) -> signal.Signals:
    """The exit signal of this run (``preemption.exit_signal``); SIGTERM outside one.
    Reads the config's JSON only (a DataLoader worker builds no config)."""
    env = env or current()
    value = env.raw_section("preemption").get("exit_signal")
    if value is not None:
        return parse_exit_signal(value)
    return signal.SIGTERM


def ignore_exit_signal(worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: this worker ignores the run's exit signal."""
    del worker_id
    signal.signal(exit_signal_from_env(), signal.SIG_IGN)
