"""Sharded state (FSDP2 ``fully_shard``, tensor parallelism) after a live replacement:
``live_state(checkpoint=manager, step=...)``.

No live rank holds a copy of a lost rank's shard, but the checkpoint manager's local tier
does: every ``non_persistent_save_interval`` steps each rank writes its shard to its
node's local directory and, with ``replication``, to the ranks ``replication_jump``
apart. In a round that follows a replacement every rank (the survivors and the
newcomer) loads the newest step of which some rank holds every rank's shard, through the
manager (:meth:`~rankguard.checkpoint.manager.CheckpointManager.load_latest`): the
newcomer's shard comes from the lost process's own files when they are on this node's
disk, else from the rank holding its replica; the per-rank state of the plan (RNG, data
position) comes with it. Every rank continues after that step: the survivors redo the
steps they had completed since (fewer than the interval). No complete local step: the
persistent tier's newest checkpoint, said in one line; none at all: the in-process
restart is abandoned (:class:`~rankguard.live.link.InProcessRestartError`) and
the launcher restarts the group, said in one line.

The manager holds the round's process group (its own gloo group): build it in the
wrapped function, in every round, as the sharded model and its optimizer. A model built
anew holds no trained state, so the same load follows any in-process restart, not only
a replacement; the first round is the script's (``step`` returned as it is).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from rankguard.live.link import InProcessRestartError, current, restart_count

if TYPE_CHECKING:
    from rankguard.checkpoint.manager import CheckpointManager
    from rankguard.checkpoint.tiers import Candidate

__all__ = ["restore_sharded", "source_of"]

logger = logging.getLogger(__name__)


def restore_sharded(manager: CheckpointManager, step: int) -> int:
    """What :func:`~rankguard.live.state.live_state` does with ``checkpoint=``: at a
    re-entry (a replacement's round, or any in-process restart: the sharded model is
    built anew in every round) the newest complete checkpoint's step, loaded; in the
    first round, or outside a wrapped call, ``step`` as it is."""
    link = current()
    if link is not None:
        link.declare(sharded=True)
    round_ = link.current_round if link is not None else restart_count()
    if round_ == 0 or (link is not None and link.synced_round == round_):
        return step
    newcomers: list[int] = []
    fresh = False  # a newcomer that holds no state yet
    if link is not None:
        link.synced_round = round_
        newcomers, fresh = list(link.newcomers), link.awaits_state
    from rankguard.live.state import _agree

    ahead, _source, _redone, _same = _agree(-1 if fresh else step)
    loaded = manager.load_latest()
    rank = manager.rank
    if loaded is None:
        _give_up(manager, newcomers, round_)
    assert loaded is not None
    where = manager.loaded_from
    assert where is not None
    redone = max(0, ahead - loaded)
    if rank == 0:
        _say(_summary(where, newcomers, redone, ahead, round_))
    if fresh and link is not None:
        optims = list(manager.plan.optims.values())
        if optims:
            from rankguard.live.state import _arm_resumed

            _arm_resumed(link, optims[0][0], loaded, redone, source=source_of(where, rank))
        link.received = True
    return loaded


def source_of(where: Candidate, rank: int) -> str:
    """Where ``rank``'s state came from, as ``restarts.jsonl``'s ``source`` says it."""
    if where.tier != "local":
        return f"checkpoint step {where.step} ({where.tier})"
    holder = where.where.get(rank, rank) if isinstance(where.where, dict) else rank
    if holder == rank:
        return f"local checkpoint step {where.step}: rank {rank}'s own local directory"
    return f"local checkpoint step {where.step}: replica on rank {holder}"


def _summary(where: Candidate, newcomers: list[int], redone: int, ahead: int, round_: int) -> str:
    """Rank 0's line: the step, each newcomer's source, the steps redone."""
    froms = "; ".join(f"rank {r}'s shard from {_from(where, r)}" for r in sorted(newcomers))
    if where.tier == "local":
        head = f"local checkpoint step {where.step}" + (f" ({froms})" if froms else "")
    else:
        head = (
            f"no complete local checkpoint step (no rank holds a verified copy of every "
            f"rank's shard): checkpoint step {where.step} ({where.tier})"
        )
    behind = f", the survivors had completed step {ahead}" if ahead > where.step else ""
    what = "live recovery" if newcomers else f"in-process restart {round_}"
    return (
        f"{what}: sharded state from {head}; every rank continues after step "
        f"{where.step}, {redone} step(s) redone{behind}"
    )


def _from(where: Candidate, rank: int) -> str:
    if where.tier != "local":
        return "that checkpoint"
    holder = where.where.get(rank, rank) if isinstance(where.where, dict) else rank
    if holder == rank:
        return "its own local directory (the lost process's files, on this node's disk)"
    return f"the replica on rank {holder}"


def _give_up(manager: CheckpointManager, newcomers: list[int], round_: int) -> None:
    """No copy of the sharded state anywhere: the group restart, said once."""
    what = (
        f"live recovery cannot continue: rank(s) {sorted(newcomers)} replaced, but"
        if newcomers
        else f"in-process restart {round_} cannot continue:"
    )
    why = (
        f"{what} no copy of the sharded state holds every rank's shard (no complete local "
        "checkpoint step, no persistent checkpoint): the worker group restarts"
    )
    if manager.rank == 0:
        _say(why)
    raise InProcessRestartError(why)


def _say(line: str) -> None:
    logger.debug("%s", line)
    print(f"[rankguard] {line}", file=sys.stderr, flush=True)
