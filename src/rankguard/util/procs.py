"""Is a local pid still a running process? (Linux /proc, with a portable fallback.)

A zombie (exited, not yet reaped by the launcher) counts as gone; a stopped process
(SIGSTOP) counts as present: that one is the heartbeat timeout's job.
"""

from __future__ import annotations

import os
import time

__all__ = ["pid_running", "process_start_time", "process_started_unix_s", "process_state"]


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


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the parenthesised command name (which may
    hold spaces or parens): state is index 0, starttime 19; None if the
    process is gone or ``/proc`` cannot tell (not Linux)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _stat_int(pid: int, index: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[index]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22);
    None if the process is gone or ``/proc`` cannot tell (not Linux).

    A pid and its start time name one process: a pid reused by a later process has
    another start time."""
    return _stat_int(pid, 19)


def process_started_unix_s(pid: int) -> float | None:
    """When ``pid`` started, in epoch seconds (to a clock tick): its start after boot
    against the time since boot now; None where ``/proc`` cannot tell."""
    ticks = process_start_time(pid)
    if ticks is None:
        return None
    try:
        per_s = os.sysconf("SC_CLK_TCK")
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError, ValueError):
        return None
    return time.time() - (since_boot - ticks / per_s) if per_s > 0 else None


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
