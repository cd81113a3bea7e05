"""Who a worker process is: a training rank or a standby, and the environment it sees.

Torch elastic numbers every worker of a node ``0 .. nproc+K-1`` (``LOCAL_RANK``) and
the job ``0 .. nnodes*(nproc+K)-1`` (``RANK``). The script must see the training world
only: the rank bootstrap rewrites the variables before the script runs
(:func:`rewrite_environ`). With ``nproc`` training ranks and ``K`` standbys per node,
the worker of local slot ``s`` on node ``g`` is

- ``s < nproc``: training rank ``g*nproc + s`` (``LOCAL_RANK`` ``s``) of
  ``WORLD_SIZE = nnodes*nproc``, ``LOCAL_WORLD_SIZE = nproc``;
- ``s >= nproc``: standby ``j = s - nproc`` of the node: ``RANK`` is
  ``WORLD_SIZE + g*K + j``, outside the training world (no rank-0 work, no data shard),
  ``LOCAL_RANK`` ``s`` (its own device), ``RANKGUARD_STANDBY=1``. When it takes a lost
  rank's place, :func:`promoted_environ` gives it that rank's ``RANK`` and
  ``LOCAL_RANK``.

Pure functions of a mapping (read through :class:`~rankguard.rank.runenv.RunEnv`): no torch,
no process state.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from rankguard.rank.runenv import RunEnv

__all__ = [
    "STANDBY_ENV",
    "STANDBY_RANKS_ENV",
    "Role",
    "is_standby",
    "promoted_environ",
    "rewrite_environ",
    "role_of",
    "standby_ranks",
]

STANDBY_RANKS_ENV = "RANKGUARD_STANDBY_RANKS"
"""Standby workers per node (set by the launcher; absent or 0: no live recovery)."""
STANDBY_ENV = "RANKGUARD_STANDBY"
"""``1`` in a standby that has not taken a rank yet."""

_RANK_NAMES = ("RANK", "ROLE_RANK")
_WORLD_NAMES = ("WORLD_SIZE", "ROLE_WORLD_SIZE")


@dataclass(frozen=True, slots=True)
class Role:
    """One worker's place: training rank ``rank`` or standby ``standby_index``."""

    standby: bool
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: int
    standby_index: int | None = None


def standby_ranks(environ: Mapping[str, str]) -> int:
    """Standby workers per node of this run (0 without live recovery)."""
    raw = environ.get(STANDBY_RANKS_ENV, "").strip()
    if not raw:
        return 0
    value = int(raw)
    if value < 0:
        raise ValueError(f"{STANDBY_RANKS_ENV}: must be >= 0, got {value}")
    return value


def is_standby(environ: Mapping[str, str]) -> bool:
    """Is this process a standby that has not taken a rank yet?"""
    return environ.get(STANDBY_ENV) == "1"


def role_of(
    *, local_rank: int, node: int, local_world_size: int, world_size: int, standbys: int
) -> Role:
    """The role of torch elastic's worker ``local_rank`` of node ``node`` (the
    numbers as torch elastic gives them: ``local_world_size`` and ``world_size`` count
    the standbys)."""
    nproc = local_world_size - standbys
    if nproc < 1 or standbys < 0:
        raise ValueError(
            f"{standbys} standby(s) of {local_world_size} workers per node: no training rank"
        )
    if local_world_size <= 0 or world_size % local_world_size:
        raise ValueError(
            f"WORLD_SIZE {world_size} is not a multiple of LOCAL_WORLD_SIZE {local_world_size}"
        )
    nnodes = world_size // local_world_size
    train_world = nnodes * nproc
    if local_rank < nproc:
        return Role(False, node * nproc + local_rank, local_rank, train_world, nproc, node)
    j = local_rank - nproc
    return Role(True, train_world + node * standbys + j, local_rank, train_world, nproc, node, j)


def rewrite_environ(environ: MutableMapping[str, str]) -> Role | None:
    """Give this worker the training world's numbers (see the module doc); None, and
    nothing changed, without standbys."""
    standbys = standby_ranks(environ)
    if standbys == 0:
        return None
    torch_env = RunEnv.from_environ(environ)  # torch elastic's numbers, standbys counted
    if torch_env.local_world_size is None:
        raise ValueError(f"{STANDBY_RANKS_ENV}: LOCAL_WORLD_SIZE is not set")
    role = role_of(
        local_rank=torch_env.local_rank,
        node=torch_env.group_rank or 0,
        local_world_size=torch_env.local_world_size,
        world_size=torch_env.world_size,
        standbys=standbys,
    )
    for name in _RANK_NAMES:
        environ[name] = str(role.rank)
    for name in _WORLD_NAMES:
        environ[name] = str(role.world_size)
    environ["LOCAL_RANK"] = str(role.local_rank)
    environ["LOCAL_WORLD_SIZE"] = str(role.local_world_size)
    if role.standby:
        environ[STANDBY_ENV] = "1"
    else:
        environ.pop(STANDBY_ENV, None)
    return role


def promoted_environ(environ: MutableMapping[str, str], *, rank: int, local_rank: int) -> None:
    """A standby takes training rank ``rank`` (``local_rank`` on its node)."""
    for name in _RANK_NAMES:
        environ[name] = str(rank)
    environ["LOCAL_RANK"] = str(local_rank)
    environ.pop(STANDBY_ENV, None)
