"""A rank dies with its launcher: no orphan keeps training (and heartbeating) after
``rankguard run`` is gone, however it went (even SIGKILL, which it cannot handle).

Two guards, belt and braces:

- :func:`set_parent_death_signal`: the kernel sends SIGKILL to the rank when its parent
  exits (Linux ``prctl(PR_SET_PDEATHSIG)``; a no-op elsewhere). The rank bootstrap sets
  it first thing, then checks with :meth:`Lifeline.lost` that the parent did not die
  before that (the race the signal cannot cover). Under ``--preload`` the ranks' parent
  is the fork server, which Python keeps alive as long as any rank holds its "alive"
  pipe, i.e. after the launcher dies; so the fork server sets the signal too
  (:mod:`rankguard.launcher.forkserver_guard`), and the chain launcher -> fork server
  -> ranks goes down at once.
- :class:`Lifeline`, checked by the heartbeat thread once per beat (never on the training
  path): the parent the rank started with is still its parent, and the launcher's pid
  (``RANKGUARD_LAUNCHER_PID``) is still alive. It covers platforms without ``prctl`` and
  a fork server that outlived the launcher. One ``getppid()`` per beat, plus one
  ``kill(pid, 0)`` when the launcher is not the direct parent.

A rank that finds its launcher gone stops itself with SIGKILL (:func:`end_orphan`), the
same end as the kernel's signal: whichever guard fires first, the rank ends the same
way, and no exit handler runs that could block on a dead peer or the dead launcher's
store (a collective, a process-group teardown, a tracker's upload).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from rankguard.rank.runenv import RunEnv, current

__all__ = [
    "ORPHAN_EXIT_CODE",
    "Lifeline",
    "end_orphan",
    "launcher_pid",
    "pid_alive",
    "set_parent_death_signal",
]

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_EXIT_CODE = 128 + signal.SIGKILL  # only if SIGKILL to itself ever returned


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits. True when
    set; False (a debug log line) where there is no ``prctl`` (not Linux) or it failed.

    Linux ties the signal to the *thread* that created the process: the launcher starts
    ranks from its main thread, which lives as long as the launcher does. The setting is
    cleared in a child the process forks, and kept across ``exec``."""
    if not sys.platform.startswith("linux"):
        logger.debug("rankguard: no PR_SET_PDEATHSIG on %s: the heartbeat check only", sys.platform)
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError) as exc:
        logger.debug("rankguard: prctl unavailable (%s): the heartbeat check only", exc)
        return False
    prctl.restype = ctypes.c_int
    if prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        logger.debug("rankguard: prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(err))
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Does process ``pid`` exist? (``kill(pid, 0)``: a process of another user exists;
    a zombie, exited but not yet reaped, still counts as alive.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launcher_pid(environ: Mapping[str, str] | None = None) -> int | None:
    """The launcher's pid ``rankguard run`` passed to its ranks, or None (not under the
    launcher, or a value that is not a pid)."""
    env = current() if environ is None else RunEnv.from_environ(environ)
    return env.launcher_pid


@dataclass
class Lifeline:
    """Is this rank's launcher still there? ``parent_pid``: the parent the rank started
    with (the launcher itself, or ``--preload``'s fork server); ``launcher_pid``: the
    launcher. The functions are the system's; tests pass fakes."""

    launcher_pid: int
    parent_pid: int
    getppid: Callable[[], int] = field(default=os.getppid, repr=False)
    alive: Callable[[int], bool] = field(default=pid_alive, repr=False)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, direct_child: bool = False
    ) -> Lifeline | None:
        """The lifeline of a rank started by ``rankguard run`` (None otherwise).
        ``direct_child``: the launcher started this process itself, so its parent must be
        the launcher (exact, even if the pid was reused or the launcher is a zombie);
        otherwise the parent now is the one to keep."""
        pid = launcher_pid(environ)
        if pid is None:
            return None
        return cls(launcher_pid=pid, parent_pid=pid if direct_child else os.getppid())

    def lost(self) -> str | None:
        """Why the launcher is gone, or None while it is there."""
        ppid = self.getppid()
        if ppid != self.parent_pid:
            who = "the launcher" if self.parent_pid == self.launcher_pid else "the fork server"
            return f"{who} (pid {self.parent_pid}) is gone: parent is now pid {ppid}"
        if self.launcher_pid != self.parent_pid and not self.alive(self.launcher_pid):
            return f"the launcher (pid {self.launcher_pid}) is gone"
        return None


def end_orphan(reason: str, kill: Callable[[int, int], None] = os.kill) -> NoReturn:
    """Say once why, then SIGKILL this process (see the module's docstring for why a
    kill and not an exit). ``kill`` is for tests."""
    with contextlib.suppress(Exception):  # stderr may be gone with the launcher
        logger.error("rankguard: rank pid %d stops itself (SIGKILL): %s", os.getpid(), reason)
    kill(os.getpid(), signal.SIGKILL)
    os._exit(ORPHAN_EXIT_CODE)  # not reached: SIGKILL cannot be caught
