"""The batch rule of an elastic job: what a step is when the number of ranks changes.

A job started with ``--nnodes MIN:MAX`` may go on with fewer nodes after a node is lost
and no spare is left (a shrink), or with more when one comes back. The training script
asks for its plan at each (re)start, from the world size it runs with now::

    plan = rankguard.init().batch_plan(global_batch=512, micro_batch=8)
    for step in range(first, steps + 1):
        for _ in range(plan.accumulation_steps):
            ...  # forward and backward of one micro-batch of 8 samples
        opt.step()

``elastic.batch_rule`` chooses the rule (the ``elastic`` section of the run's config):

- ``keep_global`` (the default): the global batch stays ``global_batch``; each rank
  accumulates ``global_batch / (micro_batch * world_size)`` micro-batches per step. A
  step is the same number of samples whatever the world size, so the learning-rate
  schedule and the data position (``step * global_batch`` samples consumed) need no
  change. The world size must divide it: otherwise :class:`BatchPlan` rounds the
  accumulation up and says the global batch it really is (``exact`` false).
- ``scale``: each rank keeps the accumulation it had at the job's full size
  (``global_batch / (micro_batch * full_world_size)``) and the global batch follows
  the world size (``micro_batch * accumulation * world_size``): steps stay as fast, a
  step is fewer samples. The data position is then counted in samples
  (``samples_before(step)`` is the caller's sum of the global batches of the steps
  done), not in steps.

Torch-free, no rankguard import: the session, the checkpoint and the perf monitor use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BATCH_RULES", "BatchPlan", "ElasticConfig", "batch_plan"]

BATCH_RULES = ("keep_global", "scale")


@dataclass(kw_only=True, slots=True)
class ElasticConfig:
    """``elastic``: how an elastic job's steps follow its world size."""

    batch_rule: str = field(
        default="keep_global",
        metadata={
            "help": "When the number of ranks changes (a shrink after a lost node, a node "
            "back): 'keep_global' keeps the global batch with more (or fewer) gradient "
            "accumulation steps; 'scale' keeps each rank's accumulation and lets the "
            "global batch follow the world size (session.batch_plan)."
        },
    )

    def __post_init__(self) -> None:
        if self.batch_rule not in BATCH_RULES:
            raise ValueError(
                f"batch_rule: one of {', '.join(BATCH_RULES)}, got {self.batch_rule!r}"
            )


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """One rank's share of a step at the current world size."""

    rule: str
    world_size: int
    micro_batch: int  # samples per micro-batch per rank
    accumulation_steps: int  # micro-batches per rank per optimizer step
    global_batch: int  # samples per optimizer step, all ranks (what it really is)
    requested_global_batch: int  # what the script asked for (at the full world size)
    exact: bool  # the global batch is the one requested (keep_global) or scaled exactly

    @property
    def samples_per_rank(self) -> int:
        return self.micro_batch * self.accumulation_steps


def batch_plan(
    global_batch: int,
    micro_batch: int,
    world_size: int,
    *,
    rule: str = "keep_global",
    full_world_size: int | None = None,
) -> BatchPlan:
    """The plan for ``world_size`` ranks (see the module doc). ``full_world_size``: the
    job's world size at its full node count (``scale`` only; default ``world_size``)."""
    for name, value in (
        ("global_batch", global_batch),
        ("micro_batch", micro_batch),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"batch_plan: {name} must be a whole number >= 1, got {value!r}")
    if rule not in BATCH_RULES:
        raise ValueError(f"batch_plan: rule must be one of {', '.join(BATCH_RULES)}, got {rule!r}")
    if rule == "keep_global":
        per_step = micro_batch * world_size
        accumulation = max(1, -(-global_batch // per_step))  # rounded up
        real = accumulation * per_step
        return BatchPlan(
            rule, world_size, micro_batch, accumulation, real, global_batch, real == global_batch
        )
    full = full_world_size if full_world_size is not None else world_size
    if isinstance(full, bool) or not isinstance(full, int) or full < world_size:
        raise ValueError(
            f"batch_plan: full_world_size must be a whole number >= world_size "
            f"({world_size}), got {full!r}"
        )
    accumulation = max(1, global_batch // (micro_batch * full))
    exact = accumulation * micro_batch * full == global_batch
    return BatchPlan(
        rule,
        world_size,
        micro_batch,
        accumulation,
        accumulation * micro_batch * world_size,
        global_batch,
        exact,
    )
