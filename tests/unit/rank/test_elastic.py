"""The batch rule of an elastic job: accumulation steps and global batch per world size."""

from __future__ import annotations

import pytest

from rankguard.config import ConfigError, RankguardConfig, build, dumps_config
from rankguard.rank.elastic import batch_plan
from rankguard.rank.runenv import ENV, RunEnv

pytestmark = pytest.mark.timeout(30)


def test_keep_global_accumulates_more_when_the_job_shrinks() -> None:
    full = batch_plan(64, 8, 4)
    shrunk = batch_plan(64, 8, 2)
    assert (full.accumulation_steps, full.global_batch, full.exact) == (2, 64, True)
    assert (shrunk.accumulation_steps, shrunk.global_batch, shrunk.exact) == (4, 64, True)
    assert shrunk.samples_per_rank == 32


def test_keep_global_rounds_up_and_says_the_real_global_batch() -> None:
    plan = batch_plan(64, 8, 3)  # 64 / 24: not whole
    assert (plan.accumulation_steps, plan.global_batch, plan.exact) == (3, 72, False)
    assert plan.requested_global_batch == 64


def test_scale_keeps_the_accumulation_and_the_global_batch_follows() -> None:
    plan = batch_plan(64, 8, 2, rule="scale", full_world_size=4)
    assert (plan.accumulation_steps, plan.global_batch, plan.exact) == (2, 32, True)
    assert batch_plan(64, 8, 4, rule="scale", full_world_size=4).global_batch == 64


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"global_batch": 0}, "global_batch must be a whole number >= 1"),
        ({"micro_batch": 2.5}, "micro_batch"),
        ({"rule": "grow"}, "rule must be one of keep_global, scale"),
        ({"rule": "scale", "full_world_size": 1}, "full_world_size must be"),
    ],
)
def test_bad_input_is_named(kw: dict, match: str) -> None:
    args = {"global_batch": 64, "micro_batch": 8, "world_size": 2, **kw}
    with pytest.raises(ValueError, match=match):
        batch_plan(**args)


def test_the_rule_is_a_strict_config_key() -> None:
    assert build(RankguardConfig, {"elastic": {"batch_rule": "scale"}}).elastic.batch_rule == (
        "scale"
    )
    with pytest.raises(ConfigError, match=r"elastic\.batch_rule: one of keep_global, scale"):
        build(RankguardConfig, {"elastic": {"batch_rule": "grow"}})
    with pytest.raises(ConfigError, match="unknown config key"):
        build(RankguardConfig, {"elastic": {"spares": 1}})


def test_the_rank_side_plan_follows_the_world_size_it_runs_with() -> None:
    cfg = build(RankguardConfig, {"elastic": {"batch_rule": "scale"}})
    env = {
        ENV.LAUNCHER: "1",
        ENV.CONFIG: dumps_config(cfg),
        ENV.MAX_WORLD_SIZE: "4",
        "WORLD_SIZE": "2",
    }
    plan = RunEnv.from_environ(env).batch_plan(64, 8)
    assert (plan.rule, plan.world_size, plan.accumulation_steps, plan.global_batch) == (
        "scale",
        2,
        2,
        32,
    )
    # outside the launcher: keep_global at torchrun's world size
    plan = RunEnv.from_environ({"WORLD_SIZE": "2"}).batch_plan(64, 8)
    assert (plan.rule, plan.accumulation_steps) == ("keep_global", 4)
