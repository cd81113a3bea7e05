"""Who a worker is with standbys, and the numbers its script sees."""

from __future__ import annotations

import pytest

from rankguard.live.roles import (
    STANDBY_ENV,
    STANDBY_RANKS_ENV,
    is_standby,
    promoted_environ,
    rewrite_environ,
    role_of,
)


def test_training_slots_keep_the_training_world_numbers() -> None:
    # 2 nodes, 4 ranks + 1 standby each: torch elastic counts 5 workers per node
    role = role_of(local_rank=3, node=1, local_world_size=5, world_size=10, standbys=1)
    assert (role.standby, role.rank, role.local_rank) == (False, 7, 3)
    assert (role.world_size, role.local_world_size) == (8, 4)


def test_a_standby_is_outside_the_training_world() -> None:
    role = role_of(local_rank=4, node=1, local_world_size=5, world_size=10, standbys=1)
    assert role.standby and role.standby_index == 0
    assert role.rank == 8 + 1  # WORLD_SIZE + node * K + j: no rank-0 work, no data shard
    assert role.local_rank == 4  # its own device
    assert role.world_size == 8


def test_no_training_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="no training rank"):
        role_of(local_rank=0, node=0, local_world_size=2, world_size=2, standbys=2)


def _torch_env(local_rank: int) -> dict[str, str]:
    return {
        STANDBY_RANKS_ENV: "1",
        "RANK": str(local_rank),
        "ROLE_RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "5",
        "ROLE_WORLD_SIZE": "5",
        "LOCAL_WORLD_SIZE": "5",
        "GROUP_RANK": "0",
    }


def test_rewrite_gives_a_rank_the_training_world() -> None:
    env = _torch_env(2)
    role = rewrite_environ(env)
    assert role is not None and not role.standby
    assert env["RANK"] == env["ROLE_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
    assert env["LOCAL_WORLD_SIZE"] == "4"
    assert not is_standby(env)


def test_rewrite_marks_a_standby_and_promotion_gives_it_the_lost_rank() -> None:
    env = _torch_env(4)
    role = rewrite_environ(env)
    assert role is not None and role.standby
    assert is_standby(env) and env["RANK"] == "4" and env["WORLD_SIZE"] == "4"
    promoted_environ(env, rank=2, local_rank=2)
    assert env["RANK"] == env["ROLE_RANK"] == "2" and env["LOCAL_RANK"] == "2"
    assert STANDBY_ENV not in env and env["WORLD_SIZE"] == "4"


def test_without_standbys_nothing_changes() -> None:
    env = _torch_env(1)
    env.pop(STANDBY_RANKS_ENV)
    before = dict(env)
    assert rewrite_environ(env) is None
    assert env == before
