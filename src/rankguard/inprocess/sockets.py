"""Release a gloo collective blocked on a live peer: shut the round's group sockets down.

On gloo a collective waits in C++ (an all-reduce's receive from the rank before it in
the ring): neither the in-process interrupt (Python) nor torch 2.13's gloo
``ProcessGroup.abort()`` releases it; only the group's timeout did. When a peer's
process is gone, the ranks that receive from it fail at once (the connection reset),
but a rank waiting on a live peer that has itself stopped waits the whole timeout.

The wrapper notes the TCP sockets a round's ``init_process_group`` opened (its
connections to the peers: :func:`tcp_sockets` before and after; never its listener,
whose thread aborts the process when its accept fails) and,
when the round fails (its ``failed`` key, its own collective error), shuts them down
(``shutdown(2)``, not ``close``: the descriptors stay the group's, closed by its
destruction). gloo's transport then sees each connection end and fails the waiting
operation at once; the peers see their end of the same connections close and fail too.
The workers' store connection is never among them (opened before the round).

Linux (``/proc``); elsewhere :func:`tcp_sockets` finds none and the timeout stays the
release. Per round, never per step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

__all__ = ["shutdown_sockets", "tcp_sockets"]

logger = logging.getLogger(__name__)

_FD_DIR = "/proc/self/fd"
_TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")


_LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes it


def _tcp_inodes() -> set[int]:
    """The inodes of this process's TCP connections, listeners left out (gloo's
    listener thread aborts the process when its accept fails)."""
    out: set[int] = set()
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] != _LISTEN and fields[9].isdigit():
                        out.add(int(fields[9]))
        except OSError:
            continue
    return out


def _socket_fds() -> dict[int, int]:
    """This process's socket descriptors: inode -> fd."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            with contextlib.suppress(ValueError):
                out[int(target[8:-1])] = int(name)
    return out


def tcp_sockets() -> frozenset[int]:
    """The inodes of this process's open TCP connections, listeners left out (empty
    where ``/proc`` is not)."""
    fds = _socket_fds()
    if not fds:
        return frozenset()
    return frozenset(set(fds) & _tcp_inodes())


def shutdown_sockets(inodes: frozenset[int]) -> int:
    """Shut down (both directions) the sockets among ``inodes`` still open in this
    process; how many. The descriptors stay open. A descriptor closed meanwhile (the
    group's own teardown) is skipped, and so is one whose number now holds another
    socket (checked on the duplicate: its inode)."""
    if not inodes:
        return 0
    done = 0
    for inode, fd in _socket_fds().items():
        if inode not in inodes:
            continue
        try:  # the group may close it meanwhile, and the number be reused
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            same = os.fstat(dup).st_ino == inode  # else another socket now: not ours
            sock = socket.socket(fileno=dup) if same else None
        except OSError:
            sock = None
        if sock is None:
            os.close(dup)
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:  # not connected, or already down
            pass
        finally:
            sock.close()  # the duplicate only
    return done
