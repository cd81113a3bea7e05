"""Dump the stacks of some rank processes, then SIGKILL the culprit: one path for every node.

Node 0's :class:`~rankguard.ft.actions.FaultHandler` dumps its local ranks before the
finding is written and kills a local culprit after it; on any other node the
:class:`~rankguard.heartbeat.relay.StoreRelay` does both when node 0 asks through the
store. Both go through :func:`dump_stacks_of` and :func:`kill_marked` (or
:func:`dump_then_kill`), with the same :class:`DumpPolicy` built from
``fault_tolerance.stack_dump`` and ``fault_tolerance.stack_dump_timeout_s``.

The dumps run in parallel: N hung ranks cost about one dump timeout, not N. Pids that
cannot be meant (``<= 1``: a signal to 0 or -1 reaches a process group or every
process) and pids that are no longer running are refused with a log line, neither dumped
nor killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.stacks import dump_stacks
from rankguard.heartbeat.procs import pid_running

__all__ = [
    "DEFAULT_DUMP_POLICY",
    "MAX_PARALLEL_DUMPS",
    "DumpKillResult",
    "DumpPolicy",
    "DumpResult",
    "KillTarget",
    "dump_stacks_of",
    "dump_then_kill",
    "kill_marked",
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
class KillTarget:
    """A rank process to dump; ``kill``: SIGKILL it after the dumps."""

    rank: int
    pid: int
    kill: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KillTarget:
        """One entry of a kill request as it travels through the store."""
        return cls(rank=int(data["rank"]), pid=int(data["pid"]), kill=bool(data.get("kill")))


@dataclass(frozen=True, slots=True)
class DumpResult:
    """Where the stacks of one target went: ``path``, or None with ``error`` saying why."""

    rank: int
    pid: int
    path: str | None
    error: str | None = None


def _refusal(pid: int) -> str | None:
    if pid <= 1:
        return f"refused pid {pid}"
    if not pid_running(pid):
        return "not running"
    return None


def _dump_one(run_dir: Path, target: KillTarget, policy: DumpPolicy) -> DumpResult:
    refused = _refusal(target.pid)
    if refused is not None:
        logger.warning(
            "rankguard: no stacks of rank %d (pid %d): %s", target.rank, target.pid, refused
        )
        return DumpResult(target.rank, target.pid, None, refused)
    try:
        path = dump_stacks(
            run_dir, target.rank, target.pid, method=policy.method, timeout_s=policy.timeout_s
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
) -> list[DumpResult]:
    """Dump every target's stacks at once; the results culprit first, then by rank.

    ``culprit``: the rank to list first; by default the targets marked ``kill``.
    """
    order = _culprit_first(targets, culprit)
    if not order:
        return []
    workers = min(MAX_PARALLEL_DUMPS, len(order))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rankguard-dump") as pool:
        return list(pool.map(lambda t: _dump_one(Path(run_dir), t, policy), order))


def kill_marked(targets: Iterable[KillTarget]) -> list[int]:
    """SIGKILL every target marked ``kill``; the pids signalled."""
    killed: list[int] = []
    for target in targets:
        if not target.kill:
            continue
        refused = _refusal(target.pid)
        if refused is not None:
            logger.warning(
                "rankguard: not killing rank %d (pid %d): %s", target.rank, target.pid, refused
            )
            continue
        logger.info("rankguard: SIGKILL to rank %d (pid %d)", target.rank, target.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(target.pid, signal.SIGKILL)
            killed.append(target.pid)
    return killed


@dataclass(frozen=True, slots=True)
class DumpKillResult:
    """What :func:`dump_then_kill` did: the dumps (culprit first) and the pids killed."""

    dumps: list[DumpResult]
    killed: list[int]


def dump_then_kill(
    run_dir: Path,
    targets: Sequence[KillTarget],
    policy: DumpPolicy,
    *,
    culprit: int | None = None,
) -> DumpKillResult:
    """Dump the stacks of every target in parallel, then SIGKILL those marked ``kill``."""
    dumps = dump_stacks_of(run_dir, targets, policy, culprit=culprit)
    return DumpKillResult(dumps=dumps, killed=kill_marked(targets))
