"""A node the previous rendezvous round lost, told to a monitor that never saw it.

When node 0 (the node whose agent runs the job monitor) is lost, its monitor goes with
it: torch elastic renews the round without it, renumbers a survivor node 0 and that
node starts a new monitor. The new monitor never saw the lost node's ranks; what it
reads is the survivors' ends, whose collectives broke because their peer went away.
Named alone, such an end would be taken for the cause. The survivor's launcher knows
better: the previous round's agents said in the rendezvous store which node each was,
and one that trained in that round did not come back to the new one (its agent left
the rendezvous: torch dropped it after its keep-alives stopped). :class:`LostNode` is
what the launcher tells the monitor about it; the monitor's rules name its rank and
hold the survivors' ends of that round as its echo.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankguard.schema.jsontypes import JsonObject

__all__ = ["LostNode"]


@dataclass(frozen=True, slots=True)
class LostNode:
    """Node ``node`` of the previous round (its agent ``agent``, ``host:pid``), with
    ranks ``ranks``, did not come back: its agent left the rendezvous. ``victim``: the
    rank of this node whose collective broke (its peer went away) and whose end made
    this node's group restart; ``restart``: that restart's reason. ``before_ns``: the
    wall time (ns) the new round was formed at; an end written before it belongs to
    the previous round."""

    node: int
    agent: str
    ranks: tuple[int, ...]
    victim: int | None
    restart: str
    before_ns: int

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("LostNode.ranks: a lost node has at least one rank")

    def to_dict(self) -> JsonObject:
        return {
            "node": self.node,
            "agent": self.agent,
            "ranks": list(self.ranks),
            "victim": self.victim,
        }

    @property
    def hostname(self) -> str:
        return self.agent.rpartition(":")[0] or self.agent

    def said(self) -> str:
        """The launcher's console line."""
        victim = f"; rank {self.victim}'s failure was its echo" if self.victim is not None else ""
        return (
            f"node {self.node} of the previous round (agent {self.agent}) did not come "
            f"back: its agent left the rendezvous, its rank(s) {self._ranks()} were lost "
            f"with it{victim}"
        )

    def _ranks(self) -> str:
        first, last = self.ranks[0], self.ranks[-1]
        return str(first) if first == last else f"{first}-{last}"

    def message(self) -> str:
        """The finding's words: what is known, and from where."""
        first = self.ranks[0]
        ranks = f"rank {first}" if len(self.ranks) == 1 else f"ranks {self._ranks()}"
        victim = (
            f"; rank {self.victim}'s collective with it broke (its peer went away)"
            if self.victim is not None
            else ""
        )
        return (
            f"rank {first} (node {self.node}, agent {self.agent}): its node was lost: "
            f"its agent left the rendezvous (its keep-alives stopped, torch elastic "
            f"renewed the round without it; {ranks} gone with it){victim}"
        )
