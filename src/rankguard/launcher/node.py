"""This node's identity in the job: torch elastic's group rank, told by the rendezvous.

Under torchrun, ``--node-rank`` is optional with the c10d rendezvous: each round numbers
the agents that joined it (torch orders them by host name, then process id) and every
worker gets that number as ``GROUP_RANK``. rankguard uses the same number for its node
identity (``gpu_health_node_<k>.json``, ``launcher_node_<k>.json``, the relay's store
keys, node 0's monitor), so the two can never disagree. A ``--node-rank`` given on the
command line is checked against it: the rendezvous wins, and a mismatch is said.

The identity follows every round: when nodes are lost or join (a spare takes a lost
node's place, a job shrinks), torch renumbers the nodes of the new round, and this
node's services move with its number (the launcher stops them and starts them again
as the new node: the new round's node 0 runs the monitor, whichever agent it is).

Pure: :func:`node_identity` decides, the launcher prints and acts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeDecision", "node_identity"]


@dataclass(frozen=True, slots=True)
class NodeDecision:
    node_rank: int  # this node's identity from now on
    first: bool  # the first round: start the node's services now
    warning: str | None = None
    moved: bool = False  # a later round renumbered this node: its services move


def node_identity(given: int | None, told: int, known: int | None) -> NodeDecision:
    """``given``: ``--node-rank`` (None when left out); ``told``: the group rank of this
    agent in the round that just completed; ``known``: the identity taken at the
    previous round (None at the first).

    A later round numbering this node otherwise (nodes joined or left an elastic job)
    moves its identity: ``moved``, said in ``warning``."""
    if told < 0:
        raise ValueError(f"the rendezvous gave this node the group rank {told}")
    if known is not None:
        if told == known:
            return NodeDecision(known, False)
        return NodeDecision(
            told,
            False,
            f"the rendezvous renumbered this node {known} -> {told} (nodes joined or left): "
            f"its services move with it (node {told}"
            f"{': the job monitor runs here now' if told == 0 else ''})",
            moved=True,
        )
    warning = None
    if given is not None and given != told:
        warning = (
            f"--node-rank {given}, but the rendezvous numbered this node {told} (torch "
            "elastic orders the nodes of a round by host name and process id; torchrun "
            f"ignores --node-rank with the c10d rendezvous): this node is node {told} for "
            "the workers (GROUP_RANK) and for rankguard"
        )
    return NodeDecision(told, True, warning)
