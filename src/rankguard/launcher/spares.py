"""Hot spares and lost nodes: who is in which rendezvous round, told through the store.

Torch elastic's c10d rendezvous admits at most ``max_nodes`` agents to a round (the
``--nnodes MIN:MAX`` of the command line). An agent arriving when the round is complete
and full waits in the rendezvous' redundancy list, with keep-alives and no timeout: a
hot spare. When a node is lost, the survivors' workers fail, their agents leave the
round, the lost node's keep-alive expires, the round is renewed and the spare joins it.
The rendezvous' own state is private to torch, so every rankguard agent says where it
stands in a small entry of its own in the rendezvous store:

- ``rankguard/<run>/agents``: a counter; each agent takes the next number once;
- ``rankguard/<run>/agent/<i>``: that agent's JSON entry, rewritten at each change:
  ``waiting`` (in the rendezvous, not in a round yet, or again after its round ended)
  or ``training`` as node ``k`` of a round of ``nodes`` nodes, with the round's tag.
  A waiting agent also counts a ``beat`` every ``keepalive_s`` (5 s, torch's own
  keep-alive interval), so that a spare killed while it waits (SIGKILL, its host lost)
  is not listed as waiting for ever.
- ``rankguard/<run>/ended``: set by the launcher of an agent that trained, when it ends
  and shuts the rendezvous down (torch closes it for every agent then). A waiting
  agent looks for it at each beat: once the job ended, a spare that learns of the end
  in any way (the rendezvous closed while torch had it on the wait list rather than
  the redundancy list, its store gone, a join timeout) was not needed, whereas a
  rendezvous lost or closed without it (a store gone mid-job, a rendezvous id that
  ended before this agent came) is still an error. Only its existence is read.

Node 0 reads every entry with one ``multi_get`` (:func:`read_agents`) and
:func:`elastic_status` turns them into the ``elastic`` block of ``status.json``: the
spares waiting, the spares gone (a beat that stopped: :class:`SpareWatch`, on node 0's
own clock, so the hosts' clocks need not agree), the nodes of the current round, the
nodes lost and which spare took whose place. Anyone who can reach the store can write
these keys: every entry is checked on the way in (:func:`agent_entry`), and what one
reading costs is bounded (``MAX_AGENTS`` entries, ``MAX_CHECKS`` existence checks), as
is the store host's wait for the spares at the end (``MAX_SPARE_WAIT_S``). Torch-free;
the writer takes any store with ``add``/``set``/``multi_get``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rankguard.schema.statusblocks import ElasticBlock, ElasticMember, Replacement, SpareWaiting

__all__ = [
    "KEEPALIVE_S",
    "MAX_KEEPALIVE_S",
    "MAX_SPARE_WAIT_S",
    "MISSED_BEATS",
    "AgentRegistry",
    "SpareWatch",
    "agent_entry",
    "elastic_status",
    "full_round_without",
    "lost_in_round",
    "read_agents",
    "spare_not_needed",
    "waiting_agents",
]

logger = logging.getLogger(__name__)

MAX_AGENTS = 4096
"""Most agent entries node 0 reads (a job restarted on new agents again and again)."""

TAIL_AGENTS = 256
"""Of those, the newest: an agent that registered after a raised counter is read."""

MAX_CHECKS = 128
"""Most existence checks (one store round trip each) of one :func:`read_agents`."""

_CHUNK = 16

MAX_ENTRY_BYTES = 4096
"""An agent entry longer than this is not one (a real one is ~300 bytes)."""

MAX_KEEPALIVE_S = 3600.0
"""The longest keep-alive interval an entry may say: the bound the launcher accepts for
the rendezvous' ``keep_alive_interval`` (``--rdzv-conf``)."""

MAX_SPARE_WAIT_S = 60.0
"""The longest the store's host waits for the spares after the job ended, whatever the
entries say."""

KEEPALIVE_S = 5.0
"""Seconds between two beats of a waiting agent (torch's rendezvous keep-alive)."""

MISSED_BEATS = 3
"""A waiting agent whose beat did not change for this many intervals (plus node 0's
own reading period) is gone: torch's rendezvous drops a node after 3 missed keep-alives
too."""


def _prefix(run_id: str) -> str:
    return f"rankguard/{run_id}/"


@dataclass
class AgentRegistry:
    """This agent's entry in the store (see the module doc). Failures to write are
    logged, never raised: the entry is for status, the rendezvous goes on without it."""

    store: Any
    run_id: str
    max_nodes: int
    min_nodes: int = 1
    agent: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    keepalive_s: float = KEEPALIVE_S
    index: int | None = field(default=None, init=False)
    entry: dict[str, Any] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _beater: threading.Thread | None = field(default=None, init=False, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    #: the job's end marker was seen in the store (kept: the store may go afterwards)
    _job_ended: bool = field(default=False, init=False, repr=False)

    def _write(self) -> None:
        try:
            if self.index is None:
                self.index = int(self.store.add(_prefix(self.run_id) + "agents", 1)) - 1
            key = f"{_prefix(self.run_id)}agent/{self.index}"
            self.store.set(key, json.dumps(self.entry, sort_keys=True).encode())
        except Exception as exc:  # the store host is gone or busy: status only
            logger.debug("rankguard: cannot write this agent's rendezvous entry: %s", exc)

    def waiting(self) -> None:
        """This agent enters the rendezvous (at start, or after its round ended)."""
        with self._lock:
            was = self.entry.get("state")
            self.entry = {
                **self.entry,
                "agent": self.agent,
                "state": "waiting",
                "since": time.time(),
                "rounds": int(self.entry.get("rounds", 0)),
                "beat": int(self.entry.get("beat", 0)),
                "keepalive_s": self.keepalive_s,
            }
            if was is None:
                self.entry["started"] = self.entry["since"]
            self._write()
            if self._beater is None and not self._closed.is_set():
                self._beater = threading.Thread(
                    target=self._beat, name="rankguard-spare-beat", daemon=True
                )
                self._beater.start()

    def _beat(self) -> None:
        """While this agent waits: one more beat every ``keepalive_s`` (the thread ends
        when the agent joins a round or leaves; :meth:`waiting` starts it again)."""
        while not self._closed.wait(self.keepalive_s):
            with self._lock:
                if self.entry.get("state") != "waiting":
                    self._beater = None
                    return
                self.entry["beat"] = int(self.entry.get("beat", 0)) + 1
                self._write()
            self.job_ended()  # seen while the store is there (it may go at the end)
        with self._lock:
            self._beater = None

    def close(self) -> None:
        """No more beats (the agent ends)."""
        self._closed.set()

    def joined(self, node: int, nodes: int, tag: str | None) -> None:
        """The round completed with this agent as node ``node`` of ``nodes``."""
        with self._lock:
            waited = time.time() - float(self.entry.get("since") or time.time())
            rounds = int(self.entry.get("rounds", 0)) + 1
            self.entry = {
                **self.entry,
                "agent": self.agent,
                "state": "training",
                "node": node,
                "nodes": nodes,
                "round": tag,
                "rounds": rounds,
                "joined": time.time(),
                "waited_s": round(waited, 3),
            }
            self._write()

    def trained(self) -> bool:
        """This agent was a node of some round of the job."""
        return int(self.entry.get("rounds", 0)) > 0

    def job_ends(self) -> None:
        """This agent trained and its launcher ends: the job's end marker, set before
        the rendezvous is closed for every agent (see the module doc)."""
        try:
            value = json.dumps({"agent": self.agent, "at": time.time()}, sort_keys=True)
            self.store.set(_prefix(self.run_id) + "ended", value.encode())
        except Exception as exc:  # the store host is gone: the spares see the close
            logger.debug("rankguard: cannot mark the job's end in the store: %s", exc)

    def job_ended(self) -> bool:
        """The job's end marker is (or was once seen) in the store."""
        if not self._job_ended:
            try:
                self._job_ended = bool(self.store.check([_prefix(self.run_id) + "ended"]))
            except Exception as exc:  # the store is gone: what was seen before it went
                logger.debug("rankguard: cannot read the job's end marker: %s", exc)
        return self._job_ended

    def left(self) -> None:
        """The job ended while this agent waited (the rendezvous was closed)."""
        with self._lock:
            self.entry = {**self.entry, "agent": self.agent, "state": "left", "left": time.time()}
            self._write()


def waiting_agents(store: Any, run_id: str, gone: frozenset[str] | set[str] = frozenset()) -> int:
    """How many agents of the run still wait in the rendezvous (``gone``: the agents
    node 0 found gone, not counted)."""
    return sum(
        1
        for a in read_agents(store, run_id)
        if a.get("state") == "waiting" and a["agent"] not in gone
    )


@dataclass
class SpareWatch:
    """Node 0's view of the waiting agents' beats, on its own monotonic clock: a beat
    that has not changed for ``MISSED_BEATS`` keep-alive intervals (plus ``slack_s``:
    how often node 0 reads the entries) is an agent gone while it waited."""

    slack_s: float = 2.0
    _seen: dict[str, tuple[Any, float]] = field(default_factory=dict, init=False)

    def gone(self, agents: list[dict[str, Any]], now: float) -> set[str]:
        """The waiting agents among ``agents`` whose beat stopped, seen at ``now``."""
        out: set[str] = set()
        waiting = set()
        for a in agents:
            if a.get("state") != "waiting":
                continue
            name = a["agent"]
            waiting.add(name)
            mark = (a.get("beat"), a.get("since"))  # a new wait starts the count again
            seen = self._seen.get(name)
            if seen is None or seen[0] != mark:
                self._seen[name] = (mark, now)
                continue
            try:
                interval = max(0.01, float(a.get("keepalive_s") or KEEPALIVE_S))
            except (TypeError, ValueError):
                interval = KEEPALIVE_S
            if now - seen[1] > MISSED_BEATS * interval + self.slack_s:
                out.add(name)
        for name in set(self._seen) - waiting:  # joined a round or left
            del self._seen[name]
        return out


def read_agents(store: Any, run_id: str) -> list[dict[str, Any]]:
    """Every agent entry of the run, each checked (:func:`agent_entry`; bad ones
    skipped). Anyone who can reach the store can write these keys and raise the
    counter: at most ``MAX_AGENTS`` entries are read (the first ones, and the newest
    ``TAIL_AGENTS``), with at most ``MAX_CHECKS`` existence checks."""
    prefix = _prefix(run_id)
    try:
        count = int(store.add(prefix + "agents", 0))
    except Exception as exc:
        logger.debug("rankguard: cannot read the agent count: %s", exc)
        return []
    if count <= 0:
        return []
    head = min(count, MAX_AGENTS - TAIL_AGENTS)
    # the tail newest first: its scan ends at the first chunk with no entry
    segments = [range(head), range(count - 1, max(head, count - TAIL_AGENTS) - 1, -1)]
    try:
        # an index is taken before its entry is written: read only entries that exist
        # (a multi_get of a missing key would wait for it)
        present = _present(store, [[f"{prefix}agent/{i}" for i in seg] for seg in segments])
        values = store.multi_get(present) if present else []
    except Exception as exc:
        logger.debug("rankguard: cannot read the agent entries: %s", exc)
        return []
    out = []
    for raw in values:
        entry = agent_entry(raw)
        if entry is not None:
            out.append(entry)
    return out


def _present(store: Any, segments: list[list[str]]) -> list[str]:
    """The keys of ``segments`` that exist: a segment's keys at once when all do, else
    by chunks, each key alone in a chunk that is not whole; a segment ends at a chunk
    with none (the counter was raised past the agents), all within ``MAX_CHECKS``."""
    out: list[str] = []
    checks = 0
    for keys in segments:
        if not keys:
            continue
        checks += 1
        if store.check(keys):
            out += keys
            continue
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            if checks >= MAX_CHECKS:
                return out
            checks += 1
            if store.check(chunk):
                out += chunk
                continue
            found: list[str] = []
            for key in chunk:
                if checks >= MAX_CHECKS:
                    return out + found
                checks += 1
                if store.check([key]):
                    found.append(key)
            if not found:
                break
            out += found
    return out


_STATES = ("waiting", "training", "left")
_TIMES = ("since", "started", "joined", "left", "waited_s")
_COUNTS = ("rounds", "beat", "node", "nodes")


def agent_entry(raw: Any) -> dict[str, Any] | None:
    """One agent's entry as read from the store, checked field by field, or None: an
    agent name (host:pid, at most 300 characters), a known state, finite numbers for
    the times, whole numbers in [0, 2^31) for the counters and node numbers, a round
    tag of at most 200 characters, and ``keepalive_s`` within what the launcher
    accepts for the rendezvous' keep-alive (``(0, MAX_KEEPALIVE_S]``)."""
    try:
        data = bytes(raw)
        if len(data) > MAX_ENTRY_BYTES:
            return None
        entry = json.loads(data.decode())
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(entry, dict):
        return None
    agent, state = entry.get("agent"), entry.get("state")
    if not isinstance(agent, str) or not 0 < len(agent) <= 300 or state not in _STATES:
        return None
    out: dict[str, Any] = {"agent": agent, "state": state}
    for key in _TIMES:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value):
            return None
        out[key] = float(value)
    for key in _COUNTS:
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
            return None
        out[key] = value
    tag = entry.get("round")
    if tag is not None:
        if not isinstance(tag, str) or len(tag) > 200:
            return None
        out["round"] = tag
    keepalive = entry.get("keepalive_s", KEEPALIVE_S)
    if isinstance(keepalive, bool) or not isinstance(keepalive, (int, float)):
        return None
    if not 0 < keepalive <= MAX_KEEPALIVE_S:  # NaN fails too
        return None
    out["keepalive_s"] = float(keepalive)
    return out


def elastic_status(
    agents: list[dict[str, Any]],
    *,
    round_tag: str | None,
    nodes: int,
    min_nodes: int,
    max_nodes: int,
    history: list[Replacement],
    gone: frozenset[str] | set[str] = frozenset(),
) -> ElasticBlock:
    """The ``elastic`` block of ``status.json`` from the agents' entries, seen by node 0
    of the round ``round_tag`` (``nodes`` nodes). ``history``: the replacements found so
    far, updated in place (a replacement is found once: the round it happened in).
    ``gone``: waiting agents whose beat stopped (:class:`SpareWatch`): listed apart,
    not as spares."""
    current = sorted(
        (a for a in agents if a.get("state") == "training" and a.get("round") == round_tag),
        key=lambda a: int(a.get("node", 0)),
    )
    members = {a["agent"] for a in current}
    waiting = sorted(
        (a for a in agents if a.get("state") == "waiting" and a["agent"] not in members),
        key=lambda a: float(a.get("since") or 0.0),
    )
    spares = [a for a in waiting if a["agent"] not in gone]
    lost = [
        a
        for a in agents
        if a["agent"] not in members
        and a.get("state") == "training"
        and a.get("round") != round_tag
    ]
    seen = {(h.round, h.node) for h in history}
    # a newcomer (its first round) next to nodes that trained before: a spare that took
    # a lost node's place (or a node that came back to a shrunk job)
    renewed = any(int(a.get("rounds", 0)) > 1 for a in current)
    for a in current:
        if not renewed or int(a.get("rounds", 0)) != 1 or (round_tag, a.get("node")) in seen:
            continue
        # whose place: a lost agent that was this node (else any lost one)
        whose = [b["agent"] for b in lost if b.get("node") == a.get("node")] or [
            b["agent"] for b in lost
        ]
        history.append(
            Replacement(
                round=round_tag,
                node=a.get("node"),
                spare=a["agent"],
                replaced=whose[0] if whose else None,
                waited_s=a.get("waited_s"),
                at=a.get("joined"),
            )
        )
    return ElasticBlock(
        nodes=nodes,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        shrunk=nodes < max_nodes,
        round=round_tag,
        members=tuple(ElasticMember(a.get("node"), a["agent"]) for a in current),
        spares_waiting=tuple(SpareWaiting(a["agent"], a.get("since")) for a in spares),
        spares_gone=tuple(a["agent"] for a in waiting if a["agent"] in gone),
        lost=tuple(sorted({a["agent"] for a in lost})),
        replacements=tuple(history),
    )


def lost_in_round(agents: list[dict[str, Any]], round_tag: str, me: str) -> list[dict[str, Any]]:
    """The agents that trained in the round ``round_tag`` and did not come back, as
    ``agents`` (:func:`read_agents`) say once the next round formed, by node number: an
    agent that left that round's group re-enters the rendezvous (its entry says
    ``waiting``, then ``training`` in the new round); one lost with its node still says
    ``training`` in the old round. ``me``: this agent (not lost)."""
    lost = (
        a
        for a in agents
        if a.get("state") == "training"
        and a.get("round") == round_tag
        and a["agent"] != me
        and a.get("node") is not None
    )
    return sorted(lost, key=lambda a: int(a["node"]))


def spare_not_needed(registry: AgentRegistry, agents: list[dict[str, Any]]) -> bool:
    """The rendezvous ended for this waiting agent (closed, its store gone, a timeout)
    after the job ended (``registry.job_ended()``) and this agent was a spare: it never
    trained in the job, or a full round trained without it (``agents``: the entries as
    read now; none once the store is gone). A node that trained and waits to rejoin
    its group after a failure is not a spare: the end of the job under it is an error."""
    if not registry.job_ended():
        return False
    return not registry.trained() or full_round_without(agents, registry.agent, registry.max_nodes)


def full_round_without(agents: list[dict[str, Any]], agent: str, max_nodes: int) -> bool:
    """A round of ``max_nodes`` nodes trains without ``agent``: it waits as a spare (a
    rendezvous timeout is then no reason to give up)."""
    rounds: dict[Any, set[str]] = {}
    for a in agents:
        if a.get("state") == "training" and a["agent"] != agent:
            rounds.setdefault(a.get("round"), set()).add(a["agent"])
    return any(len(members) >= max_nodes for members in rounds.values())
