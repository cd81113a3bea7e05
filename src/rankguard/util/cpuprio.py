"""Background work that yields the CPU to the training: :func:`yield_cpu`.

On a node whose cores all run training (a CPU job, or the data loader's workers and the
host side of a GPU job), background work at the training's priority takes a core's
share from it for as long as it runs: an async checkpoint's write slowed the following
steps up to twice on 2 cores, and the flight-recorder analyser started at a hang's kill
slowed the restarted workers' start-up (their imports) by a second. In Linux's
``SCHED_IDLE`` class (a nice of 19 where that is refused) such work runs when a core
would otherwise idle; it takes longer only when the training leaves no gap.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["yield_cpu"]

_low = threading.local()


def yield_cpu() -> str:
    """Lower the calling thread's CPU priority for good (``SCHED_IDLE``, else nice 19)
    and return the class it runs in now: ``"idle"``, ``"nice"`` or ``"normal"`` (neither
    allowed here). Threads it starts afterwards inherit it. Only for a thread that does
    nothing else: an unprivileged thread cannot raise it again."""
    done = getattr(_low, "policy", None)
    if done is not None:
        return str(done)
    policy = "normal"
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        policy = "idle"
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, tid, 19)  # Linux: this thread's nice
            policy = "nice"
    _low.policy = policy
    return policy
