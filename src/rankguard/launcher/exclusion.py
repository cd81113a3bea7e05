"""Bad-node exclusion: a node with a bad GPU, or whose ranks keep failing, leaves the job.

Built on torch elastic's rendezvous rounds (``--nnodes MIN:MAX``). Before this node
joins each round (the first, and the one of every in-job restart), :class:`NodeExclusion`
decides whether it leaves, for one of these reasons (``fault_tolerance``):

- ``exclude_bad_nodes``: its GPUs fail the health check (the collector's NVML reading
  and rules, :mod:`rankguard.health`, plus the XID errors :class:`XidWatcher` saw since
  the launcher started; a GPU with retired pages pending counts too: the retirement
  needs a GPU reset), or the rerun state machine found one of its GPUs faulty (the
  ranks exit 17 and name it: ``rerun_faulty_rank_<r>.json``);
- ``exclude_bad_nodes`` with ``node_health.enabled``: a check a node service added
  (:meth:`NodeExclusion.add_check`: the NIC links and storage of
  :mod:`rankguard.launcher.nodehealth`) fails, or that service saw a worker stuck in
  uninterruptible sleep (:meth:`NodeExclusion.exclude_next_round`);
- ``exclude_after_restarts`` K: its ranks caused K in-job restarts within
  ``exclude_window_s``. The node that caused a restart is the first whose agent saw its
  group fail in that round (``compare_set`` on one store key per round: the store
  decides, no clocks are compared); the peers that failed because of it do not count.

An excluded node leaves the rendezvous cleanly (:func:`leave_rendezvous`: torch
elastic's exit operation, the one a node runs at the start of every ``next_rendezvous``;
the others then do not wait for its keep-alive to expire), publishes its finding in the
store, writes ``node_excluded`` into ``findings.jsonl`` and the host list into
``excluded_nodes.json``, and its launcher exits with ``EXIT_NODE_EXCLUDED``. When the
nodes left can no longer reach MIN (the agents of the job, hot spares included, less the
excluded; at least ``max_nodes`` less the excluded), it closes the
rendezvous, so that every other node ends at once with the same code and the host list
(:class:`ExcludedBelowMinimum`) instead of waiting out the join timeout. Otherwise the
others form the next round without it (torch elastic: a round with fewer participants
after ``last_call_timeout``) and note the exclusion in their own run directories.

Anyone who can reach the store can write the exclusion keys: a node reads only the
entries that exist, at most ``2 x max_nodes`` of them, each checked alone
(:meth:`Exclusion.from_dict`: an RFC 1123 host name, whole numbers, bounded text), and
the scheduler commands it suggests are quoted for the shell.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)

from rankguard.ft.config import FaultToleranceConfig
from rankguard.launcher.nodeservice import NodeLeft
from rankguard.launcher.rendezvous import HandlerWrapper
from rankguard.rank.runenv import current
from rankguard.scheduler import exclusion_hint_text, exclusion_hints
from rankguard.schema.exits import EXIT_NODE_EXCLUDED, EXIT_RERUN_VALIDATION_FAILED
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.layout import (
    EXCLUDED_NODES_FILE,
    FINDINGS_FILE,
    RERUN_FAULTY_PREFIX,
    StoreKeys,
)
from rankguard.util.fs import append_jsonl, atomic_write_json, atomic_write_text
from rankguard.util.textsafe import safe_text
from rankguard.view.runfiles import read_excluded

__all__ = [
    "ExcludedBelowMinimum",
    "Exclusion",
    "ExclusionRendezvous",
    "NodeExcluded",
    "NodeExclusion",
    "RestartWindow",
    "exclusion_commands",
    "is_hostname",
    "leave_rendezvous",
    "read_excluded",
    "rerun_faulty",
    "unhealthy_gpus",
]

logger = logging.getLogger(__name__)

TRIGGERS = ("gpu_health", "restarts", "rerun", "node_health")
_REASONS = {
    "gpu_health": Reason.EXCLUDED_UNHEALTHY_GPU,
    "restarts": Reason.EXCLUDED_RESTARTS,
    "rerun": Reason.EXCLUDED_RERUN,
    "node_health": Reason.EXCLUDED_NODE_HEALTH,
}
#: a check of the node besides its GPUs, run before each round: None when it passes,
#: else (problems, why) (:mod:`rankguard.launcher.nodehealth`)
NodeCheck = Callable[[], "tuple[list[str], str] | None"]


@dataclass(frozen=True, slots=True)
class Exclusion:
    """One node taken out of the job, and why."""

    trigger: str  # gpu_health | restarts | rerun
    hostname: str
    pid: int  # the node's launcher (several agents on one host stay apart)
    node_rank: int | None  # rankguard's node identity (None: excluded before any round)
    gpu: int | None  # the GPU's index (NVML's, or the failed rank's local rank)
    problems: tuple[str, ...] = ()
    message: str = ""
    when: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )

    @property
    def node(self) -> str:
        """The node's name in the store and the host list: host and launcher pid."""
        return f"{self.hostname}:{self.pid}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "problems": list(self.problems), "node": self.node}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Exclusion:
        """An entry another node published (or anyone who can write the store): every
        field checked and bounded; ``ValueError`` naming the first one that is not."""
        if not isinstance(d, Mapping):
            raise ValueError(f"an exclusion is an object, got {type(d).__name__}")
        if d.get("trigger") not in TRIGGERS:
            raise ValueError(f"trigger: one of {TRIGGERS}, got {_short(d.get('trigger'))}")
        hostname = d.get("hostname")
        if not is_hostname(hostname):
            raise ValueError(f"hostname: a host name (RFC 1123), got {_short(hostname)}")
        problems = d.get("problems") or ()
        if not isinstance(problems, (list, tuple)):
            raise ValueError(f"problems: a list, got {type(problems).__name__}")
        message, when = d.get("message") or "", d.get("when") or ""
        if not isinstance(message, str) or not isinstance(when, str):
            raise ValueError("message, when: text")
        return cls(
            trigger=str(d["trigger"]),
            hostname=str(hostname),
            pid=_whole(d.get("pid"), "pid", low=1),
            node_rank=_whole(d.get("node_rank"), "node_rank", none=True),
            gpu=_whole(d.get("gpu"), "gpu", none=True),
            problems=tuple(str(p)[:MAX_PROBLEM] for p in problems[:MAX_PROBLEMS]),
            message=message[:MAX_MESSAGE],
            when=when[:40],
        )


MAX_MESSAGE = 1000
"""Characters kept of an exclusion's message read from the store."""
MAX_PROBLEMS = 16
MAX_PROBLEM = 200
MAX_ENTRY_BYTES = 16 << 10
"""An exclusion entry in the store longer than this is not one (a real one is < 2 KiB)."""
_MAX_ID = 1 << 31
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_hostname(name: object) -> bool:
    """A host name as RFC 1123 has it: dot-separated labels of letters, digits and
    inner hyphens, 1-63 characters each, at most 253 in all (what a scheduler command
    can be given without quoting)."""
    if not isinstance(name, str) or not 0 < len(name) <= 253:
        return False
    return all(_LABEL.fullmatch(label) for label in name.removesuffix(".").split("."))


def _whole(value: Any, name: str, *, low: int = 0, none: bool = False) -> Any:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < _MAX_ID:
        raise ValueError(f"{name}: a whole number in [{low}, 2^31), got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class NodeExcluded(NodeLeft):
    """This node left the job (raised out of the agent's rendezvous); its node number
    may be another agent's in the new round."""

    renumbered = True

    def __init__(self, exclusion: Exclusion) -> None:
        super().__init__(exclusion.message)
        self.exclusion = exclusion


class ExcludedBelowMinimum(NodeLeft):
    """The rendezvous closed or timed out after exclusions: the nodes left cannot reach
    ``--nnodes`` MIN. ``hosts``: every host excluded."""

    def __init__(self, excluded: list[Exclusion], cause: BaseException) -> None:
        hosts = sorted({e.hostname for e in excluded})
        super().__init__(f"too few nodes left after excluding {', '.join(hosts)}: {cause}")
        self.excluded = excluded
        self.hosts = hosts


# ---- the decisions (pure) -------------------------------------------------------------


def unhealthy_gpus(snapshot: Mapping[str, Any] | None) -> list[tuple[int | None, list[str]]]:
    """The GPUs of a health snapshot (:func:`rankguard.health.collect_gpu_health`) that
    exclude their node: unhealthy by the health rules, or with retired pages pending.
    A snapshot that could not be taken (``unavailable``, ``error``) excludes nothing."""
    if not snapshot or snapshot.get("status") in ("unavailable", "error"):
        return []
    bad: list[tuple[int | None, list[str]]] = []
    for gpu in snapshot.get("gpus") or []:
        if not isinstance(gpu, Mapping):
            continue
        problems = [str(p) for p in gpu.get("problems") or []]
        if gpu.get("health") == "unhealthy":
            bad.append((gpu.get("index"), problems))
        elif gpu.get("retired_pages_pending") is True:
            bad.append((gpu.get("index"), problems or ["retired_pages_pending"]))
    return bad


class RestartWindow:
    """Restarts this node caused, counted within a sliding window."""

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: deque[float] = deque()

    def count(self) -> int:
        horizon = self._clock() - self.window_s
        while self._times and self._times[0] < horizon:
            self._times.popleft()
        return len(self._times)

    def note(self) -> bool:
        """One more restart caused here: True when that makes the limit (exclude)."""
        self._times.append(self._clock())
        return self.limit > 0 and self.count() >= self.limit


def rerun_faulty(run_dir: Path, ranks: Iterable[int]) -> list[dict[str, Any]]:
    """The rerun state machine's exit 17 named these of this node's ``ranks`` faulty
    (each such rank left ``rerun_faulty_rank_<r>.json`` in its node's run directory)."""
    out = []
    for rank in sorted(set(ranks)):
        try:
            with open(run_dir / f"{RERUN_FAULTY_PREFIX}{rank}.json", encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def exclusion_commands(hosts: Iterable[str]) -> dict[str, Any]:
    """What the schedulers get (:func:`rankguard.scheduler.exclusion_hints`): each
    one's way to leave ``hosts`` out, each host a quoted shell word."""
    return exclusion_hints(hosts)


def leave_rendezvous(handler: Any) -> bool:
    """Take this node out of the rendezvous' participants, as the first step of every
    ``next_rendezvous`` does, without joining again and without closing the rendezvous
    (``shutdown`` would close it for every node). Torch elastic exposes this operation
    only inside ``DynamicRendezvousHandler`` (torch 2.13: ``_RendezvousExitOp`` run by
    its operation executor); another handler, or another torch, leaves through its
    keep-alive instead (the others drop the node after ``keep_alive_interval`` x
    ``keep_alive_max_attempt``). True when the node left at once."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    while not isinstance(handler, dr.DynamicRendezvousHandler):
        inner = getattr(handler, "inner", None)
        if inner is None:
            return False
        handler = inner
    executor = getattr(handler, "_op_executor", None)
    exit_op = getattr(dr, "_RendezvousExitOp", None)
    stop = getattr(handler, "_stop_heartbeats", None)
    if executor is None or exit_op is None or stop is None:
        return False
    try:
        stop()
        executor.run(exit_op(), time.monotonic() + handler.settings.timeout.close.total_seconds())
    except Exception as exc:
        logger.warning("rankguard: leaving the rendezvous failed: %s", exc)
        return False
    return True


# ---- the node's side --------------------------------------------------------------------


class NodeExclusion:
    """One node's exclusion: the checks before each round, the restart and exit-17
    verdicts from the agent, what is written and published when the node leaves."""

    def __init__(
        self,
        ft: FaultToleranceConfig,
        *,
        run_id: str,
        run_dir: Path,
        min_nodes: int,
        max_nodes: int,
        store: Any = None,
        command_timeout_s: float = 10.0,
        say: Callable[[str], None] = logger.warning,
        health: Callable[[], dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ft = ft
        self.run_id, self.run_dir = run_id, Path(run_dir)
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.store = store
        self.keys = StoreKeys(run_id)
        self.say = say
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.node_rank: int | None = None
        self.round_key: str | None = None
        self.round_store: Any = None
        #: node 0 writes the other nodes' exclusions into its run directory (not when
        #: every node shares one: the excluded node wrote its own line there)
        self.write_others = True
        self.rounds = 0
        self.window = RestartWindow(ft.exclude_after_restarts, ft.exclude_window_s, clock)
        self.pending: Exclusion | None = None
        self.excluded: Exclusion | None = None
        self.known: dict[str, Exclusion] = {}
        self._refused: set[int] = set()  # store entries refused (said once each)
        self.decided_s: float | None = None  # when this node decided to leave (monotonic)
        self.closed_it = False  # this node closed the rendezvous (too few nodes left)
        #: node 0's monitor, when this node runs it (``NodeServices.report_finding``)
        self.report: Callable[[Finding], bool] | None = None
        self.nproc_per_node = 1
        #: node 0: the group re-formed smaller after exclusions, with this many ranks
        #: (the monitor retires the ranks past it)
        self.on_shrink: Callable[[int], Any] | None = None
        #: called as this node decides to leave, before it leaves the rendezvous (its
        #: node number still its own): the relay's last push
        #: (``NodeServices.last_push``), so its ranks' ends reach node 0
        self.on_leave: Callable[[], None] | None = None
        self._world: int | None = None
        self._command_timeout_s = command_timeout_s
        self._health = health
        self._checks: list[NodeCheck] = []
        self._xids: Any = None
        if ft.exclude_bad_nodes and health is None:
            from rankguard.health.nvml import XidWatcher

            self._xids = XidWatcher().open()

    def close(self) -> None:
        if self._xids is not None:
            self._xids.close()

    def finish(self) -> None:
        """The job ends here: the exclusions published after this node's last round
        are noted too (node 0 writes their findings), then NVML is let go."""
        try:
            self.sync(self.node_rank == 0 and self.write_others)
        finally:
            self.close()

    def wrap(self, handler: RendezvousHandler) -> RendezvousHandler:
        return ExclusionRendezvous(handler, self)

    # ---- decisions ----------------------------------------------------------------

    def health_snapshot(self) -> dict[str, Any]:
        if self._health is not None:
            return self._health()
        from rankguard.health import collect_gpu_health

        xids = self._xids.drain() if self._xids is not None and self._xids.available else None
        return collect_gpu_health(command_timeout_s=self._command_timeout_s, xids=xids)

    def add_check(self, check: NodeCheck) -> None:
        """One more check before each round with ``exclude_bad_nodes`` (the node's NIC
        links and storage): a failure excludes the node as a bad GPU does."""
        self._checks.append(check)

    def exclude_next_round(self, problems: Iterable[str], why: str) -> None:
        """A node check failed while the round ran (a worker stuck in uninterruptible
        sleep): with ``exclude_bad_nodes`` the node leaves before the next round."""
        if self.ft.exclude_bad_nodes and self.pending is None:
            self.pending = self._exclusion("node_health", None, problems, why)

    def check(self) -> Exclusion | None:
        """Before this node joins a round: does it leave?"""
        if self.pending is not None:
            return self.pending
        if not self.ft.exclude_bad_nodes:
            return None
        snapshot = self.health_snapshot()
        bad = unhealthy_gpus(snapshot)
        if not bad:
            for node_check in self._checks:
                failed = node_check()
                if failed is not None:
                    return self._exclusion("node_health", None, failed[0], failed[1])
            return None
        index, problems = bad[0]
        more = f" (and {len(bad) - 1} more GPU(s))" if len(bad) > 1 else ""
        return self._exclusion(
            "gpu_health",
            index,
            problems,
            f"GPU {index}: {', '.join(problems) or 'unhealthy'}{more}: failed its health "
            "check before the round",
        )

    def note_failure(self, failure: Mapping[str, Any], ranks: Iterable[int]) -> None:
        """The agent saw this node's group fail (``failure``: its root cause; ``ranks``:
        this node's global ranks in the round)."""
        if self.pending is not None:
            return
        code = failure.get("exit_code")
        if code == EXIT_RERUN_VALIDATION_FAILED and self.ft.exclude_bad_nodes:
            faulty = rerun_faulty(self.run_dir, ranks)
            if faulty:
                first = faulty[0]
                gpu = first.get("gpu")
                self.pending = self._exclusion(
                    "rerun",
                    gpu if isinstance(gpu, int) else failure.get("local_rank"),
                    [f"rank {f.get('rank')}: GPU {f.get('gpu')}" for f in faulty],
                    f"the rerun state machine found GPU {gpu} faulty (rank "
                    f"{first.get('rank')}, exit 17)",
                )
                return
        if self.ft.exclude_after_restarts and self._caused_here():
            count = self.window.count() + 1
            if self.window.note():
                self.pending = self._exclusion(
                    "restarts",
                    failure.get("local_rank"),
                    [f"restarts={count}", f"window_s={self.ft.exclude_window_s:g}"],
                    f"its ranks caused {count} restart(s) within "
                    f"{self.ft.exclude_window_s:g} s (exclude_after_restarts="
                    f"{self.ft.exclude_after_restarts}); last: rank {failure.get('rank')} "
                    f"exited with {failure.get('exit_code')}",
                )

    def final_verdict_taken(self, failure: Mapping[str, Any]) -> bool:
        """An exit 17 this node acts on: the group restarts (without the faulty node)
        instead of ending the job."""
        return bool(
            self.ft.exclude_bad_nodes and failure.get("exit_code") == EXIT_RERUN_VALIDATION_FAILED
        )

    def _caused_here(self) -> bool:
        """Was this node the first of its round to see its group fail?"""
        store, key = self.round_store, self.keys.first_failure("round")
        if store is None:
            store = self.store
            key = self.keys.first_failure(self.round_key or f"round{self.rounds}")
        if store is None or self.max_nodes == 1:
            return True  # one node (or no store): every restart is this node's
        try:
            winner = store.compare_set(key, "", f"{self.hostname}:{self.pid}")
        except Exception as exc:
            logger.warning("rankguard: exclusion: cannot tell who caused the restart: %s", exc)
            return False
        return bytes(winner).decode() == f"{self.hostname}:{self.pid}"

    def _exclusion(self, trigger: str, gpu: Any, problems: Iterable[str], why: str) -> Exclusion:
        # read on every node and in node 0's finding: never "this node" (before the
        # first round the node has no number yet)
        node = f"node {self.node_rank}" if self.node_rank is not None else "a node"
        return Exclusion(
            trigger=trigger,
            hostname=self.hostname,
            pid=self.pid,
            node_rank=self.node_rank,
            gpu=gpu if isinstance(gpu, int) else None,
            problems=tuple(problems),
            message=f"{node} (host {self.hostname}, launcher pid {self.pid}) excluded: {why}",
        )

    # ---- acting -----------------------------------------------------------------------

    def on_round(self, info: RendezvousInfo) -> None:
        self.rounds += 1
        # The round's store: torch elastic's rendezvous store under a prefix of this
        # round (every node of the round has the same), where the first failure is told.
        self.round_store = getattr(info, "store", None)
        store_info = getattr(info, "bootstrap_store_info", None)
        port = getattr(store_info, "master_port", None)
        self.round_key = f"{getattr(store_info, 'master_addr', '')}:{port}" if port else None
        for stale in self.run_dir.glob(f"{RERUN_FAULTY_PREFIX}*.json"):
            stale.unlink(missing_ok=True)  # an earlier group's exit 17, read already
        # A smaller group may number this node otherwise (torch elastic's GROUP_RANK):
        # its services move to the new number (launcher/node.py, NodeServices.move), and
        # so does its identity here (the finding, the store entries).
        self.node_rank = int(info.rank)
        self.sync(self.node_rank == 0 and self.write_others)
        world = int(info.world_size) * self.nproc_per_node
        if self._world is not None and world < self._world and self.known and self.on_shrink:
            try:
                gone = self.on_shrink(world)
                self.say(f"the group re-formed with {world} rank(s); retired: {gone}")
            except Exception:
                logger.exception("rankguard: exclusion: retiring the ranks failed")
        self._world = world

    def leave(self, exclusion: Exclusion, handler: Any) -> bool:
        """This node leaves: out of the rendezvous, the finding published and written.
        True when the nodes left cannot reach MIN (the rendezvous was closed)."""
        self.decided_s = time.monotonic()
        self.excluded = exclusion
        self.say(exclusion.message)
        if self.on_leave is not None:
            try:
                self.on_leave()
            except Exception:
                logger.exception("rankguard: exclusion: the last push before leaving failed")
        clean = leave_rendezvous(handler)
        if not clean:
            self.say(
                "left the rendezvous through its keep-alive: the other nodes drop this one "
                "after keep_alive_interval x keep_alive_max_attempt"
            )
        index = self._publish(exclusion)
        self.known[exclusion.node] = exclusion
        excluded = self._excluded_so_far(index)
        count, left = len(excluded), self._nodes_left(excluded)
        below = left < self.min_nodes
        self._write(exclusion, below_min=below)
        if below:
            self.say(
                f"{count} node(s) excluded, at most {left} left: below "
                f"--nnodes MIN {self.min_nodes}; closing the rendezvous (the job ends, exit "
                f"{EXIT_NODE_EXCLUDED})"
            )
            try:
                handler.set_closed()
                self.closed_it = True
            except Exception as exc:
                logger.warning("rankguard: closing the rendezvous failed: %s", exc)
        self._say_commands()
        return below

    def below_minimum(self, cause: BaseException) -> ExcludedBelowMinimum | None:
        """The rendezvous closed or timed out: because of exclusions? Then the job ends
        here with the host list."""
        self.sync(self.node_rank == 0 and self.write_others)
        if not self.known:
            return None
        excluded = list(self.known.values())
        self._write_hosts(below_min=True)
        self._finding(
            Reason.EXCLUDED_BELOW_MIN,
            f"the nodes left cannot reach --nnodes MIN {self.min_nodes} after excluding "
            f"{', '.join(sorted({e.hostname for e in excluded}))}: the job ends (exit "
            f"{EXIT_NODE_EXCLUDED}); retry it without them",
            excluded=[e.to_dict() for e in excluded],
        )
        self._say_commands()
        if self.store is not None:
            try:  # read: an excluded node hosting the store may let it go
                self.store.add(self.keys.excluded_ended, 1)
            except Exception as exc:
                logger.debug("rankguard: exclusion: the store: %s", exc)
        return ExcludedBelowMinimum(excluded, cause)

    def hold(self, handler: Any, hosting: bool, poll_s: float = 1.0) -> None:
        """This excluded node hosts the rendezvous store or runs node 0's monitor: keep
        them (no workers here) until the other nodes end the job and close the
        rendezvous; when it closed the rendezvous itself, until the others have read the
        host list (at most 10 s)."""
        while True:
            try:
                if handler.is_closed():
                    break
            except Exception as exc:
                self.say(f"the rendezvous cannot be read ({exc}): stopping")
                return
            time.sleep(poll_s)
        if not (self.closed_it and hosting and self.store is not None):
            return
        others = self.max_nodes - max(1, len(self.known))
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                if int(self.store.add(self.keys.excluded_ended, 0)) >= others:
                    return
            except Exception:
                return
            time.sleep(0.2)

    def sync(self, write_findings: bool) -> list[Exclusion]:
        """Learn the exclusions the other nodes published; the new ones are written in
        this node's run directory (their findings by node 0 only)."""
        if self.store is None:
            return []
        try:
            count = int(self.store.add(self.keys.excluded_count, 0))
        except Exception as exc:
            logger.debug("rankguard: exclusion: the store: %s", exc)
            return []
        new = []
        for exclusion in self._read(self._indices(count)).values():
            if exclusion.node not in self.known:
                self.known[exclusion.node] = exclusion
                new.append(exclusion)
        if new:
            self._write_hosts(below_min=False)
            for exclusion in new:
                self.say(f"{exclusion.message}; the job goes on without it")
                if write_findings:
                    self._finding(_REASONS[exclusion.trigger], exclusion.message, exclusion)
        return new

    def published_nodes(self) -> set[str]:
        """The nodes (``host:pid``) excluded from the job: those known here and those any
        node published in the store, read now without learning them (:meth:`sync` does,
        with their lines and findings)."""
        nodes = set(self.known)
        if self.store is None:
            return nodes
        try:
            count = int(self.store.add(self.keys.excluded_count, 0))
        except Exception as exc:
            logger.debug("rankguard: exclusion: the store: %s", exc)
            return nodes
        return nodes | {e.node for e in self._read(self._indices(count)).values()}

    def _indices(self, count: int) -> list[int]:
        """The entries read for a count: the first and the last ``max_nodes`` (a job
        excludes at most its nodes; the count is a store counter anyone can raise, and
        an entry published after a raised count is among the last)."""
        cap = max(1, self.max_nodes)
        count = max(0, count)
        head = range(1, min(count, cap) + 1)
        return [*head, *range(max(cap + 1, count - cap + 1), count + 1)]

    def _read(self, indices: list[int], wait_s: float = 0.0) -> dict[int, Exclusion]:
        """The entries at ``indices`` that exist (a ``multi_get`` of a missing key would
        wait the store's whole timeout), each parsed alone: a bad one is skipped and
        said once. ``wait_s``: how long a missing one may take to appear (an index is
        taken just before its entry is written)."""
        keys = {i: self.keys.excluded(str(i)) for i in indices}
        if not keys:
            return {}
        deadline = time.monotonic() + wait_s
        try:
            while True:
                if self.store.check(list(keys.values())):
                    present = list(keys)
                else:
                    present = [i for i, k in keys.items() if self.store.check([k])]
                if len(present) == len(keys) or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            values = self.store.multi_get([keys[i] for i in present]) if present else []
        except Exception as exc:
            logger.debug("rankguard: exclusion: the store: %s", exc)
            return {}
        out = {}
        for index, raw in zip(present, values, strict=True):
            try:
                data = bytes(raw)
                if len(data) > MAX_ENTRY_BYTES:
                    raise ValueError(f"{len(data)} bytes (at most {MAX_ENTRY_BYTES})")
                out[index] = Exclusion.from_dict(json.loads(data.decode()))
            except (ValueError, TypeError, RecursionError) as exc:
                if index not in self._refused:
                    self._refused.add(index)
                    self.say(f"exclusion entry {index} in the store refused: {safe_text(exc)}")
        return out

    def _excluded_so_far(self, index: int | None) -> set[str]:
        """Nodes excluded so far (host:pid), this one included: the entries published
        before this node's ``index`` that exist and hold an exclusion (the count is a
        store counter anyone can raise: a raised count lists nobody)."""
        nodes = set(self.known)
        if index is not None and self.store is not None:
            earlier = [i for i in self._indices(index) if i < index]
            nodes |= {e.node for e in self._read(earlier, wait_s=1.0).values()}
        return nodes

    def _nodes_left(self, excluded: set[str]) -> int:
        """The nodes that can still form a round once ``excluded`` (host:pid) are out:
        the job's agents that say where they are in the store (hot spares beyond
        ``max_nodes`` included: :mod:`.spares`), less the excluded and those that
        left; never fewer than ``max_nodes`` less the excluded (an agent may not have
        reached the rendezvous yet). An agent lost without a word still counts: the
        rendezvous is then not closed here, and its timeout ends the job the same way
        (:meth:`below_minimum`)."""
        from rankguard.launcher.spares import read_agents

        agents = read_agents(self.store, self.run_id) if self.store is not None else []
        live = {a["agent"] for a in agents if a.get("state") != "left"} - excluded
        return max(self.max_nodes - len(excluded), len(live))

    def _publish(self, exclusion: Exclusion) -> int | None:
        """Into the store for the other nodes; the entry's index (None: not published)."""
        if self.store is None:
            return None
        try:
            index = int(self.store.add(self.keys.excluded_count, 1))
            self.store.set(self.keys.excluded(str(index)), json.dumps(exclusion.to_dict()))
            return index
        except Exception as exc:
            logger.warning("rankguard: exclusion: cannot publish to the store: %s", exc)
            return None

    def _write(self, exclusion: Exclusion, *, below_min: bool) -> None:
        self._finding(_REASONS[exclusion.trigger], exclusion.message, exclusion)
        self._write_hosts(below_min=below_min)
        try:
            exclude_file = current().exclude_file  # set by the sbatch script
        except ValueError as exc:
            self.say(f"the Slurm exclude file: {exc}")
            exclude_file = None
        if exclude_file:
            try:  # one file per node: several may leave at once
                atomic_write_text(f"{exclude_file}.node.{self.pid}", exclusion.hostname + "\n")
            except OSError as exc:
                self.say(f"cannot write the Slurm exclude file {exclude_file}: {exc}")

    def _write_hosts(self, *, below_min: bool) -> None:
        nodes = sorted(self.known.values(), key=lambda e: (e.when, e.node))
        hosts = sorted({e.hostname for e in nodes})
        try:
            atomic_write_json(
                self.run_dir / EXCLUDED_NODES_FILE,
                {
                    "schema_version": 1,
                    "run_id": self.run_id,
                    "hosts": hosts,
                    "nodes": [e.to_dict() for e in nodes],
                    "min_nodes": self.min_nodes,
                    "max_nodes": self.max_nodes,
                    "below_min_nodes": below_min,
                    **exclusion_commands(hosts),
                },
            )
        except OSError as exc:
            self.say(f"cannot write {EXCLUDED_NODES_FILE}: {exc}")

    def _finding(
        self,
        reason: Reason,
        message: str,
        exclusion: Exclusion | None = None,
        **detail: Any,
    ) -> None:
        where: dict[str, Any] = {}
        if exclusion is not None:
            where = {
                "hostname": exclusion.hostname,
                "node_rank": exclusion.node_rank,
                "pid": exclusion.pid,
            }
            detail = {
                "trigger": exclusion.trigger,
                "node": exclusion.node,
                "gpu_index": exclusion.gpu,
                "problems": list(exclusion.problems),
                **detail,
            }
        hosts = sorted({e.hostname for e in self.known.values()})
        finding = Finding.build(
            FindingType.NODE_EXCLUDED,
            reason,
            run_id=self.run_id,
            rank=-1,
            message=message,
            action="exclude",
            detected_wall_time=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            detail={**detail, **exclusion_commands(hosts)},
            **where,
        )
        if self.report is not None and self.report(finding):
            return  # node 0's monitor writes it, and counts it with its own
        try:
            append_jsonl(self.run_dir / FINDINGS_FILE, [finding.to_dict()])
        except OSError as exc:
            self.say(f"cannot write the finding: {exc}")

    def _say_commands(self) -> None:
        hosts = sorted({e.hostname for e in self.known.values()})
        if hosts:
            hints = exclusion_hint_text(exclusion_commands(hosts))
            self.say(
                f"excluded host(s): {', '.join(hosts)}; {hints} "
                f"({self.run_dir / EXCLUDED_NODES_FILE})"
            )


class ExclusionRendezvous(HandlerWrapper):
    """Torch elastic's handler, plus :class:`NodeExclusion`'s check before each round
    (:class:`NodeExcluded` instead of joining) and its reading of a rendezvous that
    closed or timed out because of exclusions (:class:`ExcludedBelowMinimum`)."""

    def __init__(self, inner: RendezvousHandler, exclusion: NodeExclusion) -> None:
        super().__init__(inner)
        self.exclusion = exclusion

    def next_rendezvous(self) -> RendezvousInfo:
        ex = self.exclusion
        decision = ex.check()
        if decision is not None:
            ex.leave(decision, self.inner)
            raise NodeExcluded(decision)
        try:
            info = self.inner.next_rendezvous()
        except (RendezvousClosedError, RendezvousTimeoutError) as exc:
            ended = ex.below_minimum(exc)
            if ended is None:
                raise
            raise ended from exc
        ex.on_round(info)
        return info

    def shutdown(self) -> bool:
        if self.exclusion.excluded is not None:
            return True  # it left already: closing would end the others' rendezvous
        return self.inner.shutdown()
