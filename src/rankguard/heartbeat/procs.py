"""Is a local pid still a running process? (Linux /proc, with a portable fallback.)

A zombie (exited, not yet reaped by the launcher) counts as gone; a stopped process
(SIGSTOP) counts as present: that one is the heartbeat timeout's job.
"""

from __future__ import annotations

import os

__all__ = ["pid_running", "process_state"]


def process_state(pid: int) -> str | None:
    """The one-letter state of ``/proc/<pid>/stat`` (R, S, T, Z, ...); None if gone,
    "" if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    # state is the first field after the parenthesised command name
    close = stat.rfind(b")")
    return stat[close + 2 : close + 3].decode("ascii", "replace")


def pid_running(pid: int) -> bool:
    state = process_state(pid)
    if state is None:
        return False
    if state:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
