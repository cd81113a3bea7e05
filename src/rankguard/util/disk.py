"""Is the disk under a node's run directory full?

A rank whose heartbeats cannot be written (a full disk: ``ENOSPC``) looks to the monitor
exactly like a hung or dead rank: no new record. Killing it does not help: the restarted
ranks cannot write either, and the restart budget is spent on a full disk. So the
monitor needs to know, per node, whether the disk its ranks write to is full, and the
rules then report a stale rank on such a node as ``node_disk_full`` (no kill) instead of
``rank_process_heartbeat_timeout``.

Who measures: the launcher of each node, not the ranks. Every scan (node 0's monitor)
and every push (the relay of node k, in the store payload next to the GPU health) it
asks ``os.statvfs`` about its run directory: microseconds, no write, so it works on a
full disk. The publisher cannot tell anyone itself: its only channel is a file on that
very disk (it counts its failed writes in ``write_errors``), and giving every rank a
store connection of its own would add thousands of store clients to reach the same
verdict the launcher reaches with one call. The verdict is per node, where a disk is;
with a shared filesystem (no relay), node 0's run directory is every rank's disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["DISK_FULL_BELOW_BYTES", "DiskState", "disk_state"]

#: Free space under which a disk counts as full: a few heartbeat records' worth.
DISK_FULL_BELOW_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class DiskState:
    """Free space of the filesystem of a run directory (space for an unprivileged
    writer); ``full`` when under :data:`DISK_FULL_BELOW_BYTES` or out of inodes.
    ``error``: statvfs failed (then nothing is known and ``full`` is False)."""

    full: bool
    free_bytes: int | None = None
    total_bytes: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "full": self.full,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> DiskState | None:
        """The state as relayed through the store, or None when it is not one."""
        if not isinstance(raw, dict) or type(raw.get("full")) is not bool:
            return None
        free, total, error = raw.get("free_bytes"), raw.get("total_bytes"), raw.get("error")
        return cls(
            full=raw["full"],
            free_bytes=free if type(free) is int and free >= 0 else None,
            total_bytes=total if type(total) is int and total >= 0 else None,
            error=str(error)[:500] if error is not None else None,
        )


def disk_state(path: str | os.PathLike[str]) -> DiskState:
    """The state of the filesystem holding ``path`` now."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return DiskState(full=False, error=str(exc))
    free = st.f_bavail * st.f_frsize
    out_of_inodes = st.f_files > 0 and st.f_favail == 0
    return DiskState(
        full=free < DISK_FULL_BELOW_BYTES or out_of_inodes,
        free_bytes=free,
        total_bytes=st.f_blocks * st.f_frsize,
    )
