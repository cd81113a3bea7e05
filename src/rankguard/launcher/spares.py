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

Node 0 reads every entry with one ``multi_get`` (:func:`read_agents`) and
:func:`elastic_status` turns them into the ``elastic`` block of ``status.json``: the
spares waiting, the spares gone (a beat that stopped: :class:`SpareWatch`, on node 0's
own clock, so the hosts' clocks need not agree), the nodes of the current round, the
nodes lost and which spare took whose place. Torch-free; the writer takes any store
with ``add``/``set``/``multi_get``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KEEPALIVE_S",
    "MISSED_BEATS",
    "AgentRegistry",
    "SpareWatch",
    "elastic_status",
    "full_round_without",
    "read_agents",
    "waiting_agents",
]

logger = logging.getLogger(__name__)

MAX_AGENTS = 4096
"""Most agent entries node 0 reads (a job restarted on new agents again and again)."""

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
    """Every agent entry of the run (bad ones skipped)."""
    prefix = _prefix(run_id)
    try:
        count = int(store.add(prefix + "agents", 0))
    except Exception as exc:
        logger.debug("rankguard: cannot read the agent count: %s", exc)
        return []
    count = min(count, MAX_AGENTS)
    if count <= 0:
        return []
    keys = [f"{prefix}agent/{i}" for i in range(count)]
    try:
        # an index is taken before its entry is written: read only entries that exist
        # (a multi_get of a missing key would wait for it)
        present = keys if store.check(keys) else [k for k in keys if store.check([k])]
        values = store.multi_get(present) if present else []
    except Exception as exc:
        logger.debug("rankguard: cannot read the agent entries: %s", exc)
        return []
    out = []
    for raw in values:
        try:
            entry = json.loads(bytes(raw).decode())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("agent"), str):
            out.append(entry)
    return out


def elastic_status(
    agents: list[dict[str, Any]],
    *,
    round_tag: str | None,
    nodes: int,
    min_nodes: int,
    max_nodes: int,
    history: list[dict[str, Any]],
    gone: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
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
    seen = {(h["round"], h["node"]) for h in history}
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
            {
                "round": round_tag,
                "node": a.get("node"),
                "spare": a["agent"],
                "replaced": whose[0] if whose else None,
                "waited_s": a.get("waited_s"),
                "at": a.get("joined"),
            }
        )
    return {
        "nodes": nodes,
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "shrunk": nodes < max_nodes,
        "round": round_tag,
        "members": [{"node": a.get("node"), "agent": a["agent"]} for a in current],
        "spares_waiting": [{"agent": a["agent"], "since": a.get("since")} for a in spares],
        "spares_gone": [a["agent"] for a in waiting if a["agent"] in gone],
        "lost": sorted({a["agent"] for a in lost}),
        "replacements": list(history),
    }


def full_round_without(agents: list[dict[str, Any]], agent: str, max_nodes: int) -> bool:
    """A round of ``max_nodes`` nodes trains without ``agent``: it waits as a spare (a
    rendezvous timeout is then no reason to give up)."""
    rounds: dict[Any, set[str]] = {}
    for a in agents:
        if a.get("state") == "training" and a["agent"] != agent:
            rounds.setdefault(a.get("round"), set()).add(a["agent"])
    return any(len(members) >= max_nodes for members in rounds.values())
