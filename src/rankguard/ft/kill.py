"""Dump the stacks of some rank processes, then SIGKILL the culprit: one path for every node.

Node 0's :class:`~rankguard.ft.actions.FaultHandler` dumps its local ranks before the
finding is written and kills a local culprit after it; on any other node the
:class:`~rankguard.relay.relay.StoreRelay` does both when node 0 asks through the
store. Both go through :func:`dump_stacks_of` and :func:`kill_marked` (or
:func:`dump_then_kill`), with the same :class:`DumpPolicy` built from
``fault_tolerance.stack_dump`` and ``fault_tolerance.stack_dump_timeout_s``.

The dumps run in parallel: N hung ranks cost about one dump timeout, not N.

Signals go only to this node's own workers. The pids come from heartbeat records, and
on other nodes from a request in the rendezvous store, which any client of the store
can write; so every target is checked against a :class:`WorkerRegistry`, the workers
the local agent started (:class:`OwnedWorkers`: pid and start time, so a pid reused by
another process since is not a worker). Refused with a log line, neither dumped nor
killed, and reported in the result: pids that cannot be meant (``<= 1``: a signal to 0
or -1 reaches a process group or every process), pids no longer running, and pids that
are not a current worker of this node. The kill itself goes through a pidfd
(:func:`signal_pid`): opened, checked again, signalled, so a pid reused between the
check and the signal is never hit.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.stacks import dump_stacks
from rankguard.schema.payloads import KillTarget  # what a kill request names
from rankguard.util.procs import pid_running, process_start_time

__all__ = [
    "DEFAULT_DUMP_POLICY",
    "MAX_PARALLEL_DUMPS",
    "DumpKillResult",
    "DumpPolicy",
    "DumpResult",
    "KillRefusal",
    "KillTarget",
    "OwnedWorkers",
    "WorkerRegistry",
    "dump_stacks_of",
    "dump_then_kill",
    "kill_marked",
    "signal_pid",
]

logger = logging.getLogger(__name__)

# Dumps at once: one thread each (py-spy runs as a child process, faulthandler is a
# signal and a wait). More than the ranks of any one node.
MAX_PARALLEL_DUMPS = 32

STACK_DUMP_METHODS = ("auto", "py-spy", "faulthandler")


@dataclass(frozen=True, slots=True)
class DumpPolicy:
    """How stacks are taken: ``fault_tolerance.stack_dump`` and its per-rank timeout."""

    method: str = "auto"
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.method not in STACK_DUMP_METHODS:
            raise ValueError(f"stack dump method: one of {list(STACK_DUMP_METHODS)}")
        if self.timeout_s <= 0:
            raise ValueError(f"stack dump timeout: must be > 0, got {self.timeout_s}")

    @classmethod
    def from_config(cls, cfg: FaultToleranceConfig) -> DumpPolicy:
        return cls(method=cfg.stack_dump, timeout_s=cfg.stack_dump_timeout_s)


DEFAULT_DUMP_POLICY = DumpPolicy()


@dataclass(frozen=True, slots=True)
class DumpResult:
    """Where the stacks of one target went: ``path``, or None with ``error`` saying why."""

    rank: int
    pid: int
    path: str | None
    error: str | None = None


class WorkerRegistry(Protocol):
    """The processes this node may signal: its agent's current workers."""

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is one of them, still the same process."""
        ...


class OwnedWorkers:
    """The workers the local agent started: pid -> start time, taken when they started.

    :meth:`owns` is true only for a pid of the current worker group whose start time is
    unchanged: a pid reused by another process (between a finding and the kill, up to a
    dump timeout later) is not a worker. Where ``/proc`` cannot tell a start time (not
    Linux) the pid alone is checked. Thread-safe: the agent replaces the group, the
    monitor and the relay ask."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[int, int | None] = {}

    def set(self, pids: Iterable[int]) -> None:
        """A new worker group started: these pids, from now on, are the workers."""
        started = {int(pid): process_start_time(int(pid)) for pid in pids if int(pid) > 1}
        with self._lock:
            self._started = started

    def add(self, pid: int) -> None:
        """A worker started into the running group (a refilled standby)."""
        if pid > 1:
            started = process_start_time(pid)
            with self._lock:
                self._started[pid] = started

    def clear(self) -> None:
        """The worker group was stopped: no worker until the next :meth:`set`."""
        with self._lock:
            self._started = {}

    def pids(self) -> dict[int, int | None]:
        """The current workers' pids and start times (None: unknown)."""
        with self._lock:
            return dict(self._started)

    def owns(self, pid: int) -> bool:
        if pid <= 1:
            return False
        with self._lock:
            if pid not in self._started:
                return False
            started = self._started[pid]
        if started is None:
            return pid_running(pid)
        return process_start_time(pid) == started


NOT_A_WORKER = "not a current worker of this node (or its pid was reused)"


def _refusal(pid: int, owner: WorkerRegistry | None) -> str | None:
    if pid <= 1:
        return f"refused pid {pid}"
    if not pid_running(pid):
        return "not running"
    if owner is not None and not owner.owns(pid):
        return NOT_A_WORKER
    return None


def _dump_one(
    run_dir: Path,
    target: KillTarget,
    policy: DumpPolicy,
    owner: WorkerRegistry | None,
    native: bool = True,
) -> DumpResult:
    refused = _refusal(target.pid, owner)
    if refused is not None:
        logger.warning(
            "rankguard: no stacks of rank %d (pid %d): %s", target.rank, target.pid, refused
        )
        return DumpResult(target.rank, target.pid, None, refused)
    try:
        path = dump_stacks(
            run_dir,
            target.rank,
            target.pid,
            method=policy.method,
            timeout_s=policy.timeout_s,
            native=native,
        )
    except Exception as exc:  # one rank's failed dump must not stop the others or the kill
        logger.warning("rankguard: stack dump of rank %d failed: %s", target.rank, exc)
        return DumpResult(target.rank, target.pid, None, str(exc))
    return DumpResult(target.rank, target.pid, path, None if path else "dump failed")


def _culprit_first(targets: Iterable[KillTarget], culprit: int | None) -> list[KillTarget]:
    """The culprit (given, else the targets marked kill) first, then by rank."""
    if culprit is None:
        return sorted(targets, key=lambda t: (not t.kill, t.rank))
    return sorted(targets, key=lambda t: (t.rank != culprit, t.rank))


def dump_stacks_of(
    run_dir: Path,
    targets: Iterable[KillTarget],
    policy: DumpPolicy,
    *,
    culprit: int | None = None,
    owner: WorkerRegistry | None = None,
    on_culprit: Callable[[DumpResult], None] | None = None,
) -> list[DumpResult]:
    """Dump every target's stacks at once; the results culprit first, then by rank.

    ``culprit``: the rank to list first; by default the targets marked ``kill``.
    ``owner``: the only processes that may be signalled (None: the caller started the
    targets itself); any other target is refused, its result saying why.
    ``on_culprit``: called (in the caller's thread) with the first target's result as
    soon as it is in, while the others' dumps go on; those others keep running (the
    culprit is replaced, not the group restarted) and get their Python frames only, not
    paused to unwind native ones.
    """
    order = _culprit_first(targets, culprit)
    if not order:
        return []
    workers = min(MAX_PARALLEL_DUMPS, len(order))
    others_native = on_culprit is None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rankguard-dump") as pool:
        futures = [
            pool.submit(_dump_one, Path(run_dir), t, policy, owner, i == 0 or others_native)
            for i, t in enumerate(order)
        ]
        if on_culprit is not None:
            on_culprit(futures[0].result())
        return [f.result() for f in futures]


@dataclass(frozen=True, slots=True)
class KillRefusal:
    """A target marked ``kill`` that was not signalled, and why."""

    rank: int
    pid: int
    reason: str


def _kill(
    targets: Iterable[KillTarget], owner: WorkerRegistry | None
) -> tuple[list[int], list[KillRefusal]]:
    killed: list[int] = []
    refusals: list[KillRefusal] = []
    for target in targets:
        if not target.kill:
            continue
        refused = _refusal(target.pid, owner)
        if refused is not None:
            logger.warning(
                "rankguard: not killing rank %d (pid %d): %s", target.rank, target.pid, refused
            )
            refusals.append(KillRefusal(target.rank, target.pid, refused))
            continue
        logger.info("rankguard: SIGKILL to rank %d (pid %d)", target.rank, target.pid)
        sent = signal_pid(target.pid, signal.SIGKILL, None if owner is None else owner.owns)
        if sent:
            killed.append(target.pid)
        elif sent is None:
            refusals.append(KillRefusal(target.rank, target.pid, NOT_A_WORKER))
    return killed, refusals


def signal_pid(pid: int, sig: int, still_ours: Callable[[int], bool] | None) -> bool | None:
    """Send ``sig`` to ``pid`` if ``still_ours(pid)`` holds at the time it is sent:
    through a pidfd where the kernel has them (opened first, then checked, then
    signalled: the process cannot be replaced in between), else with ``os.kill`` right
    after the check. True: sent; False: the process is gone; None: refused."""
    open_pidfd = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    fd = None
    if open_pidfd is not None and send is not None:
        try:
            fd = open_pidfd(pid)
        except ProcessLookupError:
            return False
        except OSError:  # no pidfds here (an old kernel, a sandbox)
            fd = None
    try:
        if still_ours is not None and not still_ours(pid):
            return None
        if fd is not None and send is not None:
            send(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def kill_marked(targets: Iterable[KillTarget], *, owner: WorkerRegistry | None = None) -> list[int]:
    """SIGKILL every target marked ``kill`` that ``owner`` owns; the pids signalled."""
    return _kill(targets, owner)[0]


@dataclass(frozen=True, slots=True)
class DumpKillResult:
    """What :func:`dump_then_kill` did: the dumps (culprit first), the pids killed and the
    kills refused."""

    dumps: list[DumpResult]
    killed: list[int]
    refused: list[KillRefusal] = field(default_factory=list)


def dump_then_kill(
    run_dir: Path,
    targets: Sequence[KillTarget],
    policy: DumpPolicy,
    *,
    culprit: int | None = None,
    owner: WorkerRegistry | None = None,
) -> DumpKillResult:
    """Dump the stacks of every target in parallel, then SIGKILL those marked ``kill``;
    with ``owner``, only its workers are dumped or killed."""
    dumps = dump_stacks_of(run_dir, targets, policy, culprit=culprit, owner=owner)
    killed, refused = _kill(targets, owner)
    return DumpKillResult(dumps=dumps, killed=killed, refused=refused)
