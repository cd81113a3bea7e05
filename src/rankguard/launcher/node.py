"""This node's identity in the job: torch elastic's group rank, told by the rendezvous.

Under torchrun, ``--node-rank`` is optional with the c10d rendezvous: each round numbers
the agents that joined it (torch orders them by host name, then process id) and every
worker gets that number as ``GROUP_RANK``. rankguard uses the same number for its node
identity (``gpu_health_node_<k>.json``, ``launcher_node_<k>.json``, the relay's store
keys, node 0's monitor), so the two can never disagree. A ``--node-rank`` given on the
command line is checked against it: the rendezvous wins, and a mismatch is said.

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


def node_identity(given: int | None, told: int, known: int | None) -> NodeDecision:
    """``given``: ``--node-rank`` (None when left out); ``told``: the group rank of this
    agent in the round that just completed; ``known``: the identity taken at an earlier
    round (None at the first).

    The identity is taken once, at the first round: the services started then (node 0's
    monitor, the relays' store keys, file names) keep it. A later round numbering this
    node otherwise (nodes joined or left an elastic job) is said, not followed."""
    if told < 0:
        raise ValueError(f"the rendezvous gave this node the group rank {told}")
    if known is not None:
        warning = None
        if told != known:
            warning = (
                f"the rendezvous renumbered this node {known} -> {told} (nodes joined or "
                f"left); rankguard keeps node {known} for its files and services, while "
                f"the workers now see GROUP_RANK={told}: per-node findings and kill "
                "requests may name the wrong node until the job restarts"
            )
        return NodeDecision(known, False, warning)
    warning = None
    if given is not None and given != told:
        warning = (
            f"--node-rank {given}, but the rendezvous numbered this node {told} (torch "
            "elastic orders the nodes of a round by host name and process id; torchrun "
            f"ignores --node-rank with the c10d rendezvous): this node is node {told} for "
            "the workers (GROUP_RANK) and for rankguard"
        )
    return NodeDecision(told, True, warning)
