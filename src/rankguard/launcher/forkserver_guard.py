"""Imported by ``--preload``'s fork server (one of its preload modules): the fork server
dies with the launcher, so the ranks it forked die with it (see
:mod:`rankguard.rank.lifeline`).

Python's fork server only exits once nobody holds its "alive" pipe, and every rank it
forks holds it: after a SIGKILL of the launcher it would keep running, and so would the
ranks, whose parent it is. With the parent-death signal set here, the kernel kills the
fork server when the launcher exits, and the ranks' own parent-death signal then kills
them. Importing this module anywhere else does nothing but that: only a child of the
launcher is guarded (the fork server is the launcher's only child that imports it).

A guarded fork server also turns automatic collection off for its imports (torch's: full
collections while the heap grows through them); the last preload module
(:mod:`rankguard.launcher.forkserver_warm`) collects once, freezes and turns it back on.
"""

from __future__ import annotations

import os
import signal

from rankguard.rank.lifeline import Lifeline, end_orphan, launcher_pid, set_parent_death_signal
from rankguard.util.gcfreeze import pause_collection

__all__ = ["guard_fork_server"]


def guard_fork_server() -> bool:
    """Tie this process (the fork server) to the launcher: True when it did."""
    pid = launcher_pid()
    if pid is None or os.getppid() != pid:
        # Not the launcher's child; or the launcher is gone already, and then the fork
        # server exits by itself: no rank holds its alive pipe yet.
        return False
    lifeline = Lifeline.from_env(direct_child=True)
    set_parent_death_signal(signal.SIGKILL)
    if lifeline is not None and (reason := lifeline.lost()) is not None:
        end_orphan(f"fork server: {reason}")
    pause_collection()  # until forkserver_warm's freeze, after the imports
    return True


guard_fork_server()
