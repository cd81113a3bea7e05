"""The launcher's decision when worker processes end: replace them live, or restart.

Pure logic (no store, no processes): :func:`decide` takes what the agent saw (the
workers that ended, the standbys waiting, whether the script declared its state) and
returns who replaces whom, or the one reason why live recovery cannot apply (the group
restart of torch elastic then, as without standbys). :class:`Assignment` is the record
the launcher hands a standby through the store, checked on the way in.

Across nodes, node 0's: :func:`lost_nodes` (a node whose launcher went silent and whose
ranks the survivors await at a re-entry) and :func:`decide_takeover` (which nodes'
waiting standbys take a lost node's ranks, all or none); the records each node
publishes (:class:`NodeView`) and node 0's claims (:class:`Claim`), checked on the way
in (:mod:`rankguard.live.nodes` moves them through the store).
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, field

__all__ = [
    "LIVE_CAUSE",
    "SHRINK_CAUSE",
    "SHRINK_YES",
    "Assignment",
    "Claim",
    "Ended",
    "LiveDecision",
    "NodeView",
    "Resumed",
    "Takeover",
    "claims_from_json",
    "claims_to_json",
    "decide",
    "decide_takeover",
    "ended_how",
    "lost_nodes",
]

MAX_RECORD_BYTES = 4096
"""A record longer than this is not one of ours."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A worker process of this node that ended."""

    local_rank: int  # torch elastic's slot of the process
    rank: int | None  # the training rank it held (None: a standby that never took one)
    pid: int
    exit_code: int
    error_file: bool  # it wrote torch elastic's error file (a Python error escaped)


@dataclass(frozen=True, slots=True)
class Assignment:
    """Standby ``standby_pid`` takes training rank ``rank`` (``local_rank`` on its node)
    of ``lost_pid``, lost at ``fault_t`` (unix seconds) for ``cause``."""

    rank: int
    local_rank: int
    lost_pid: int
    standby_pid: int
    cause: str
    fault_t: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Assignment:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("live assignment: too long")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("live assignment: not an object")
        try:
            out = cls(
                rank=int(data["rank"]),
                local_rank=int(data["local_rank"]),
                lost_pid=int(data["lost_pid"]),
                standby_pid=int(data["standby_pid"]),
                cause=str(data["cause"])[:200],
                fault_t=float(data["fault_t"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"live assignment: {exc}") from None
        if out.rank < 0 or out.local_rank < 0:
            raise ValueError("live assignment: negative rank")
        return out


@dataclass(frozen=True, slots=True)
class Resumed:
    """The newcomer's first completed step after it took its rank."""

    t: float  # unix seconds
    step: int  # the step every rank continued after
    steps_redone: int
    # where the newcomer's state came from: "replica on rank 0" (a live peer's copy),
    # "local checkpoint step 5: ..." or "checkpoint step 3 (persistent)"; None: not said
    source: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Resumed:
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError("live resumed record: too long")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("live resumed record: not an object")
        try:
            source = data.get("source")
            out = cls(
                t=float(data["t"]),
                step=int(data["step"]),
                steps_redone=int(data["steps_redone"]),
                source=None if source is None else str(source)[:500],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"live resumed record: {exc}") from None
        if out.steps_redone < 0:
            raise ValueError("live resumed record: negative steps_redone")
        return out


@dataclass(frozen=True, slots=True)
class LiveDecision:
    """``pairs``: (lost, standby) to replace; ``restart``: why the group restarts
    instead (None: live recovery applies to every loss)."""

    pairs: list[tuple[Ended, int]] = field(default_factory=list)  # (lost, standby local rank)
    restart: str | None = None
    dropped: list[Ended] = field(default_factory=list)  # lost with no standby: the job shrinks


def ended_how(exit_code: int) -> str:
    """``SIGKILL``, ``exit code 124``: how a process ended."""
    if exit_code < 0:
        try:
            return signal.Signals(-exit_code).name
        except ValueError:
            return f"signal {-exit_code}"
    return f"exit code {exit_code}"


def decide(
    lost: list[Ended],
    standbys: list[int],
    *,
    declared: bool,
    stopping: str | None = None,
    shrink: str | None = None,
    world: int = 0,
) -> LiveDecision:
    """Who replaces whom among ``lost`` (training ranks whose process ended with a
    non-zero status), with the waiting ``standbys`` (their local ranks, in the order
    they are to be used). ``declared``: the script declared its state
    (:func:`~rankguard.live.state.live_state`). ``stopping``: the launcher is stopping
    the job (a signal, preemption, an abort): no recovery, and why. ``shrink``: the
    lost ranks no standby is left for may be dropped (the job goes on in process with
    fewer ranks: ``inprocess_restart.shrink_when_no_standby``): ``"yes"``, or why not
    (None: not asked for); ``world``: the training ranks before the loss."""
    if not lost:
        return LiveDecision()
    names = ", ".join(f"rank {e.rank} ({ended_how(e.exit_code)})" for e in lost)
    if stopping:
        return LiveDecision(restart=f"{names} lost while {stopping}")
    raised = [e for e in lost if e.error_file]
    if raised:
        return LiveDecision(
            restart=f"rank {raised[0].rank} ended with a Python error (its error file): "
            "the script failed, not only its process"
        )
    if not declared:
        return LiveDecision(
            restart=f"{names} lost, but the script declares no live state "
            "(rankguard.inprocess.live_state): a standby could not get it"
        )
    if len(standbys) < len(lost):
        left = "no standby left" if not standbys else f"only {len(standbys)} standby(s) left"
        why = f"{names} lost and {left} on this node"
        if shrink is None:
            return LiveDecision(restart=why)
        if shrink != SHRINK_YES:
            return LiveDecision(restart=f"{why}; no shrink: {shrink}")
        if world - len(lost) < 1:
            return LiveDecision(restart=f"{why}; no shrink: no rank would be left")
        n = len(standbys)
        return LiveDecision(
            pairs=list(zip(lost[:n], standbys, strict=True)), dropped=list(lost[n:])
        )
    return LiveDecision(pairs=list(zip(lost, standbys[: len(lost)], strict=True)))


SHRINK_YES = "yes"
""":func:`decide`'s ``shrink`` when the job may go on with fewer ranks."""

LIVE_CAUSE = "rank_lost"
"""The in-process round's cause when a standby replaced a lost rank (the launcher writes
that recovery's ``restarts.jsonl`` line, of kind ``live_recovery``)."""

SHRINK_CAUSE = "rank_lost_no_standby"
"""The in-process round's cause when the ranks went on without a lost rank, no standby
being left (the launcher writes that recovery's ``restarts.jsonl`` line, of kind
``live_recovery`` with ``shrink``)."""


# ---- a lost node's ranks taken over by other nodes' standbys --------------------------

MAX_NODE_BYTES = 65536
"""A node's view or a claim longer than this is not one of ours."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """What a node's launcher publishes while it watches its workers (``node/<node>``):
    when (unix seconds), its standbys waiting, the training ranks it holds (rank -> pid)
    and its host."""

    node: int
    t: float
    waiting: int
    ranks: dict[int, int]
    hostname: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "t": self.t,
                "waiting": self.waiting,
                "ranks": {str(r): p for r, p in sorted(self.ranks.items())},
                "hostname": self.hostname,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> NodeView:
        data = _bounded_json(raw, MAX_NODE_BYTES, "live node view")
        if not isinstance(data, dict) or not isinstance(data.get("ranks"), dict):
            raise ValueError("live node view: not an object with ranks")
        try:
            out = cls(
                node=int(data["node"]),
                t=float(data["t"]),
                waiting=int(data["waiting"]),
                ranks={int(r): int(p) for r, p in data["ranks"].items()},
                hostname=str(data.get("hostname", ""))[:200],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"live node view: {exc}") from None
        if out.node < 0 or out.waiting < 0 or any(r < 0 for r in out.ranks):
            raise ValueError("live node view: negative number")
        return out


@dataclass(frozen=True, slots=True)
class Claim:
    """A lost node's rank that a standby of the claimed node takes (``take/<node>``):
    the rank, its last pid and host, its node, and the fault's time: the lost
    launcher's last view (unix seconds; the node was lost after it, within a view's
    interval when its launcher went with it)."""

    rank: int
    lost_pid: int
    lost_node: int
    fault_t: float
    hostname: str = ""


def claims_to_json(claims: list[Claim]) -> str:
    return json.dumps([asdict(c) for c in claims], sort_keys=True)


def claims_from_json(raw: bytes | str) -> list[Claim]:
    data = _bounded_json(raw, MAX_NODE_BYTES, "live claim")
    if not isinstance(data, list):
        raise ValueError("live claim: not a list")
    try:
        out = [
            Claim(
                rank=int(c["rank"]),
                lost_pid=int(c["lost_pid"]),
                lost_node=int(c["lost_node"]),
                fault_t=float(c["fault_t"]),
                hostname=str(c.get("hostname", ""))[:200],
            )
            for c in data
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"live claim: {exc}") from None
    if any(c.rank < 0 or c.lost_node < 0 for c in out):
        raise ValueError("live claim: negative rank or node")
    return out


@dataclass(frozen=True, slots=True)
class Takeover:
    """Node 0's decision for lost node ``node``: ``claims`` (node -> the ranks its
    standbys take), or ``refused``: why not (today's path then)."""

    node: int
    claims: dict[int, list[Claim]] = field(default_factory=dict)
    refused: str | None = None


def lost_nodes(
    views: dict[int, NodeView],
    awaited: dict[int, float],
    *,
    now: float,
    silent_s: float,
    awaited_s: float,
) -> list[int]:
    """The nodes node 0 takes as lost: their launcher's view is older than ``silent_s``
    (the launcher is gone) and every training rank they held is awaited by the survivors
    at a round's barrier, seen within ``awaited_s`` (their processes are gone too: a
    silent launcher whose ranks still train is not a lost node). ``awaited``: rank ->
    when a survivor last said it waits for it."""
    out = []
    for node, view in sorted(views.items()):
        if now - view.t <= silent_s or not view.ranks:
            continue
        if all(now - awaited.get(r, float("-inf")) <= awaited_s for r in view.ranks):
            out.append(node)
    return out


def decide_takeover(
    lost: NodeView,
    views: dict[int, NodeView],
    *,
    now: float,
    silent_s: float,
    declared: bool,
) -> Takeover:
    """Which nodes' standbys take ``lost``'s ranks: the live nodes' (view within
    ``silent_s``) waiting standbys, node by node in order, all or none. ``declared``:
    the script declared its state (:func:`~rankguard.live.state.live_state`)."""
    ranks = sorted(lost.ranks)
    names = f"node {lost.node}'s rank(s) {', '.join(map(str, ranks))}"
    if not declared:
        return Takeover(
            lost.node,
            refused=f"{names} lost, but the script declares no live state "
            "(rankguard.inprocess.live_state): a standby could not get it",
        )
    live = [v for n, v in sorted(views.items()) if n != lost.node and now - v.t <= silent_s]
    waiting = sum(v.waiting for v in live)
    if waiting < len(ranks):
        return Takeover(
            lost.node,
            refused=f"{names} lost and {waiting} standby(s) waiting on the other nodes",
        )
    claims: dict[int, list[Claim]] = {}
    todo = list(ranks)
    for view in live:
        mine, todo = todo[: view.waiting], todo[view.waiting :]
        if mine:
            claims[view.node] = [
                Claim(r, lost.ranks[r], lost.node, lost.t, lost.hostname) for r in mine
            ]
    return Takeover(lost.node, claims=claims)


def _bounded_json(raw: bytes | str, limit: int, what: str) -> object:
    if len(raw) > limit:
        raise ValueError(f"{what}: too long")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
