"""Live recovery across nodes: what each node's launcher says in the workers' store, and
node 0's decision when a node is lost (its launcher and its ranks gone together).

Every node's launcher holds one :class:`NodeWatch` (through
:class:`~rankguard.launcher.live.LiveRecovery`, from its watch of the workers):

- :meth:`NodeWatch.publish`: the node's view (``node/<node>``, a
  :class:`~rankguard.live.plan.NodeView`: its standbys waiting, the training ranks it
  holds with their pids) every ``VIEW_EVERY_S``: the launcher's keep-alive too;
- node 0, :meth:`NodeWatch.decide`: a node whose view is older than ``silent_s`` and
  whose ranks the survivors wait for at a round's barrier (``awaited/<rank>``) is lost;
  with enough standbys waiting on the other nodes it writes ``taken/<node>``, then
  ``lost/<rank> = replacing`` for each lost rank (the survivors wait for them), then
  each chosen node's claims (``take/<node>``); not enough: nothing is written, one line;
- every node, :meth:`NodeWatch.claims`: the ranks node 0 gave its standbys (one store
  ``check`` per poll);
- :meth:`NodeWatch.publish_entry` / :meth:`NodeWatch.collect`: a recovery of another
  node reaches node 0 (``entry/<node>/<i>``), whose ``restarts.jsonl`` and status are the
  job's.

Store calls only (no processes): the decision itself is
:func:`~rankguard.live.plan.decide_takeover`, pure.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from rankguard.live.keys import REPLACING, LiveKeys
from rankguard.live.plan import (
    MAX_NODE_BYTES,
    Claim,
    NodeView,
    Takeover,
    claims_from_json,
    claims_to_json,
    decide_takeover,
    lost_nodes,
)

__all__ = ["AWAITED_FRESH_S", "COLLECT_EVERY_S", "NODE_SILENT_S", "VIEW_EVERY_S", "NodeWatch"]

logger = logging.getLogger(__name__)

VIEW_EVERY_S = 0.2
"""A node's launcher refreshes its view this often (its keep-alive for node 0)."""
NODE_SILENT_S = 1.5
"""A node whose view is older than this (its launcher gone), and whose ranks the
survivors wait for, is lost (at least: the launcher takes a quarter of
``inprocess_restart.heartbeat_timeout``, the survivors' shortest wait for a peer that
cannot re-enter: node 0 has to decide within it)."""
AWAITED_FRESH_S = 2.0
"""A survivor's ``awaited/<rank>`` counts as evidence this long (it is refreshed every
``AWAITED_EVERY_S`` while it waits)."""
COLLECT_EVERY_S = 0.5
"""Node 0 looks for the other nodes' recoveries this often (one ``check`` per node; a
recovery's line waits for the newcomer's first step anyway)."""
_MAX_ENTRY_BYTES = 16384


class NodeWatch:
    """One node's side of live recovery across nodes (see the module doc)."""

    def __init__(
        self,
        keys: LiveKeys,
        node: int,
        nnodes: int,
        *,
        hostname: str = "",
        silent_s: float = NODE_SILENT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys, self.node, self.nnodes = keys, node, nnodes
        self.hostname = hostname
        self.silent_s = silent_s
        self.clock = clock
        self.takeovers: dict[int, Takeover] = {}  # node 0: the lost nodes taken over
        self.refused: dict[int, str] = {}  # node 0: the lost nodes it could not take over
        self._claims_for: dict[int, list[Claim]] = {}  # node 0: every claim per node
        self._claimed: set[int] = set()  # the ranks of claims already handed out here
        self._published_at = float("-inf")
        self._decided_at = float("-inf")
        self._collected_at = float("-inf")
        self._entries_out = 0  # this node's recoveries published
        self._entries_in = dict.fromkeys(range(1, nnodes), 0)  # node 0: read per node

    @property
    def several(self) -> bool:
        return self.nnodes > 1

    # ---- every node -----------------------------------------------------------------

    def publish(
        self, store: Any, *, waiting: int, ranks: dict[int, int], now: bool = False
    ) -> None:
        """This node's view (``ranks``: the training ranks still running here), at most
        every ``VIEW_EVERY_S`` (``now``: whenever it was). A node whose ranks all
        completed publishes none: its launcher's silence then is no loss."""
        t = self.clock()
        if not self.several or (not now and t - self._published_at < VIEW_EVERY_S):
            return
        self._published_at = t
        view = NodeView(self.node, t, waiting, dict(ranks), self.hostname)
        store.set(self.keys.node(self.node), view.to_json())

    def claims(self, store: Any) -> list[Claim]:
        """The lost ranks node 0 gave this node's standbys, not yet handed out."""
        if not self.several:
            return []
        key = self.keys.take(self.node)
        if not store.check([key]):
            return []
        new = [c for c in claims_from_json(store.get(key)) if c.rank not in self._claimed]
        self._claimed.update(c.rank for c in new)
        return new

    def taken_over(self, store: Any, node: int | None = None) -> bool:
        """Node 0 gave ``node``'s ranks (default: this node's) to other nodes' standbys."""
        node = self.node if node is None else node
        return self.several and bool(store.check([self.keys.taken(node)]))

    def any_taken(self, store: Any) -> bool:
        """A node of the job was taken over (its agent lost: the exit barrier waits for
        it in vain)."""
        return any(self.taken_over(store, n) for n in range(self.nnodes))

    def publish_entry(self, store: Any, entry: dict[str, Any]) -> None:
        """A recovery of this node (not node 0): for node 0 to write."""
        if not self.several or self.node == 0:
            return
        store.set(self.keys.entry(self.node, self._entries_out), json.dumps(entry))
        self._entries_out += 1

    # ---- node 0 ---------------------------------------------------------------------

    def decide(
        self, store: Any, *, declared: Callable[[], bool], stopping: str | None
    ) -> list[str]:
        """Node 0: take the lost nodes over (or say why not); the lines to say."""
        now = self.clock()
        if self.node != 0 or not self.several or now - self._decided_at < VIEW_EVERY_S:
            return []
        self._decided_at = now
        views = self._views(store)
        silent = [
            n
            for n, v in views.items()
            if now - v.t > self.silent_s and n not in self.takeovers and n not in self.refused
        ]
        if not silent:
            return []
        awaited = self._awaited(store, [r for n in silent for r in views[n].ranks])
        lines = []
        for lost in lost_nodes(
            {n: views[n] for n in silent},
            awaited,
            now=now,
            silent_s=self.silent_s,
            awaited_s=AWAITED_FRESH_S,
        ):
            lines.append(self._take_over(store, views, lost, now, declared, stopping))
        return lines

    def _take_over(
        self,
        store: Any,
        views: dict[int, NodeView],
        lost: int,
        now: float,
        declared: Callable[[], bool],
        stopping: str | None,
    ) -> str:
        view = views[lost]
        if stopping:
            decision = Takeover(lost, refused=f"node {lost} lost while {stopping}")
        else:
            others = {n: v for n, v in views.items() if n not in self.takeovers}
            decision = decide_takeover(
                view, others, now=now, silent_s=self.silent_s, declared=declared()
            )
        if decision.refused is not None:
            self.refused[lost] = decision.refused
            return (
                f"live recovery cannot apply: {decision.refused}: today's path (the group "
                "restart, a hot spare or shrink)"
            )
        self.takeovers[lost] = decision
        store.set(self.keys.taken(lost), json.dumps(sorted(view.ranks)))
        for rank in sorted(view.ranks):  # the survivors wait for them from now on
            store.set(self.keys.lost(rank), REPLACING)
        for node, claims in sorted(decision.claims.items()):
            self._claims_for.setdefault(node, []).extend(claims)
            store.set(self.keys.take(node), claims_to_json(self._claims_for[node]))
        given = "; ".join(
            f"node {n}: rank(s) {', '.join(str(c.rank) for c in cs)}"
            for n, cs in sorted(decision.claims.items())
        )
        return (
            f"live recovery: node {lost} lost (its launcher silent {now - view.t:.1f} s, its "
            f"ranks awaited by the survivors): its ranks go to other nodes' standbys "
            f"({given}); no group restart"
        )

    def collect(self, store: Any, *, now: bool = False) -> list[dict[str, Any]]:
        """Node 0: the other nodes' recoveries published since the last look (at most
        every ``COLLECT_EVERY_S``; ``now``: whenever it was)."""
        out: list[dict[str, Any]] = []
        t = self.clock()
        if self.node != 0 or (not now and t - self._collected_at < COLLECT_EVERY_S):
            return out
        self._collected_at = t
        for node in self._entries_in:
            while store.check([key := self.keys.entry(node, self._entries_in[node])]):
                self._entries_in[node] += 1
                raw = store.get(key)
                try:
                    if len(raw) > _MAX_ENTRY_BYTES:
                        raise ValueError("too long")
                    entry = json.loads(raw)
                    if not isinstance(entry, dict):
                        raise ValueError("not an object")
                except ValueError as exc:
                    logger.warning("rankguard: node %d's live recovery record: %s", node, exc)
                    continue
                out.append(entry)
        return out

    def _views(self, store: Any) -> dict[int, NodeView]:
        """Every node's view: one ``check`` and one ``multi_get`` once every node has
        published (a store without ``multi_get``, or a node not yet: one key at a time)."""
        keys = [self.keys.node(n) for n in range(self.nnodes)]
        multi_get = getattr(store, "multi_get", None)
        if multi_get is not None and store.check(keys):
            found = list(enumerate(multi_get(keys)))
        else:
            found = [(n, store.get(k)) for n, k in enumerate(keys) if store.check([k])]
        out = {}
        for node, raw in found:
            try:
                out[node] = NodeView.from_json(raw[: MAX_NODE_BYTES + 1])
            except ValueError as exc:
                logger.warning("rankguard: live recovery: node %d's view: %s", node, exc)
        return out

    def _awaited(self, store: Any, ranks: list[int]) -> dict[int, float]:
        out = {}
        for rank in ranks:
            key = self.keys.awaited(rank)
            if store.check([key]):
                try:
                    out[rank] = float(_text(store.get(key))[:40])
                except ValueError:
                    continue
        return out


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
