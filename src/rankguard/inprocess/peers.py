"""Is a peer missing at a re-entry barrier gone, and on what evidence?

A rank that has not come back may be dead, or alive and slow: starved of CPU for a few
seconds, in a long garbage collection, stopped (SIGSTOP), or with its main thread still
stuck until its soft timeout. Only the first is lost; giving up on the second ends every
rank's in-process restart for nothing. So "gone" rests on evidence:

- every rank publishes its process (:class:`ProcessId`: host, boot, pid namespace, pid
  and start time) in the job's store once per wrapped call;
- a rank that shares the missing peer's host, boot and pid namespace checks its process
  in ``/proc`` (:meth:`ProcessId.check`): exited, a zombie or its pid now another
  process: gone at once, and the round's keys say so to the ranks of other hosts; alive
  (running, sleeping, stopped): never gone, only ``barrier_timeout`` ends the wait (a
  rank stuck for good is ended by its own hard timeout, and then its process is gone);
- no rank can see the process (its whole host is silent): gone when its store heartbeat
  has not moved for :func:`silence_bound`.

:class:`PeerWatch` holds the decision (a clock passed in: no threads, no store).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from rankguard.inprocess.config import InProcessRestartConfig
from rankguard.util.procs import process_start_time, process_state

__all__ = ["Life", "PeerWatch", "ProcessId", "silence_bound"]

_MAX_ID_BYTES = 1024  # a real one is < 200 bytes


def silence_bound(cfg: InProcessRestartConfig) -> tuple[float, str]:
    """(seconds, the setting they come from): how long a peer's store heartbeat may
    stand still before the peer is lost, when no rank can see its process:
    ``hard_timeout``, at least ``heartbeat_timeout``. The watcher thread that beats is
    held up with the rest of its process (CPU starvation, a long collection, a stop); up
    to ``hard_timeout`` the in-process restart lets a rank be unresponsive before its
    process is ended, so a shorter silence is no evidence of a death."""
    if cfg.heartbeat_timeout > cfg.hard_timeout:
        return cfg.heartbeat_timeout, "heartbeat_timeout"
    return cfg.hard_timeout, "hard_timeout"


class Life(Enum):
    """What a rank sees of a peer's process."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # another host or pid namespace, or nothing published


def _machine() -> str | None:
    """This boot of this machine and this pid namespace: where a pid names a process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{ns}"


@dataclass(frozen=True, slots=True)
class ProcessId:
    """One process, as its peers on the same machine can find it again."""

    host: str
    machine: str  # boot id and pid namespace
    pid: int
    start: int  # clock ticks after boot: a reused pid has another

    @classmethod
    def own(cls, host: str | None = None) -> ProcessId | None:
        """This process (None where ``/proc`` cannot tell: its peers then rely on its
        store heartbeat alone)."""
        machine = _machine()
        pid = os.getpid()
        start = process_start_time(pid)
        if machine is None or start is None:
            return None
        return cls(host or socket.gethostname(), machine, pid, start)

    def to_json(self) -> str:
        return json.dumps(
            {"host": self.host, "machine": self.machine, "pid": self.pid, "start": self.start}
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ProcessId | None:
        """A peer's identity read from the store (anyone who can reach it can write it):
        None for anything but a bounded, well-typed one."""
        if len(text) > _MAX_ID_BYTES:
            return None
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(d, dict):
            return None
        host, machine, pid, start = (d.get(k) for k in ("host", "machine", "pid", "start"))
        if not (isinstance(host, str) and isinstance(machine, str)):
            return None
        if type(pid) is not int or type(start) is not int or not 0 < pid < 1 << 31:
            return None
        return cls(host[:253], machine[:200], pid, start)

    def check(self, here: ProcessId | None) -> tuple[Life, str]:
        """The process as seen from ``here`` (this rank's own identity), and why."""
        if here is None or (self.host, self.machine) != (here.host, here.machine):
            return Life.UNKNOWN, ""
        where = f"pid {self.pid} on {self.host}"
        state = process_state(self.pid)
        if state is None:
            return Life.DEAD, f"its process ({where}) exited"
        if state in ("Z", "X"):
            return Life.DEAD, f"its process ({where}) exited (not yet reaped)"
        if not state:
            return Life.UNKNOWN, ""
        start = process_start_time(self.pid)
        if start is not None and start != self.start:
            return Life.DEAD, f"its process ({where}) exited (the pid is another process now)"
        return Life.ALIVE, f"its process ({where}) is alive (state {state})"


class PeerWatch:
    """A barrier's view of its missing peers: their heartbeat counts over time and what
    is known of their processes; :meth:`verdict` says whether one is gone, and why."""

    def __init__(
        self,
        bound: float,
        bound_name: str = "hard_timeout",
        *,
        dead_grace: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound = bound
        self.bound_name = bound_name
        # with standbys: the launcher's time to see the exit and send one (its key says
        # so) before a peer whose process exited is given up on
        self.dead_grace = dead_grace
        self._clock = clock
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (count, when it moved)

    def silent_s(self, rank: int, count: int) -> float:
        """Seconds ``rank``'s heartbeat count has stood at ``count`` (0 when it moved)."""
        now = self._clock()
        old = self._seen.get(rank)
        if old is None or old[0] != count:
            self._seen[rank] = (count, now)
            return 0.0
        return now - old[1]

    def verdict(self, rank: int, count: int, life: Life, why: str = "") -> str | None:
        """Why ``rank`` is gone (None: not on this evidence). ``count``: its store
        heartbeat now (0: never beat, still starting); ``life``/``why``: what is known
        of its process."""
        silent = self.silent_s(rank, count)
        if life is Life.DEAD:
            return (why or "its process exited") if silent >= self.dead_grace else None
        if life is Life.ALIVE or count <= 0:
            return None  # alive, or still starting: barrier_timeout is the only limit
        if silent > self.bound:
            return (
                f"store heartbeat stopped: silent {silent:.1f}s > {self.bound_name} "
                f"{self.bound:g}s, no rank on its host to see its process"
            )
        return None
