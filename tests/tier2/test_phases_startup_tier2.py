"""Ranks as threads: nanoGPT evaluates at iteration 0, before any optimizer step (its own
train.py does), under NVRx's setup section. Rank 0's ``estimate_loss()`` lasts longer
than the setup section and is an evaluation (the eval timeout applies); rank 1, waiting
for it in its first step's gradient all-reduce, is blocked by it: no finding. The same
assertions as the end-to-end run this replaces (setup 10 s, step 3 s, eval 12 s, eval
timeout 20 s), with the timeouts scaled to seconds (setup 3 s, step 1 s, eval 4 s, eval
timeout 8 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rankguard.launcher.elastic import features_line
from rankguard.launcher.options import LaunchOptions
from tests.harness import RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]

EVAL_S = 4.0
SETS = (
    "heartbeat.eval_timeout_s=8",
    # --ft-rank_section_timeouts=setup:3,step:1 (NVRx's flag, parsed into these keys)
    "fault_tolerance.rank_section_timeouts={setup: 3, step: 1}",
)
ITERS = 3


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, seconds: float) -> float:
    """nanoGPT's evaluation, by name: a big validation set takes ``seconds``."""
    losses = []
    for _ in range(4):
        time.sleep(seconds / 4)
        losses.append(float(model(torch.ones(2, 4)).sum()))
    return sum(losses) / len(losses)


def nanogpt_evaluating_first(ctx: RankContext) -> int:
    """nanoGPT's loop, unmodified: the master process evaluates at iteration 0 (and every
    ``eval_interval``, past the end here), then every rank steps; progress from the
    optimizer hook the rank bootstrap installs."""
    ctx.session.install_optimizer_hook()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    iter_num = 0
    while True:
        if iter_num % 100 == 0 and ctx.rank == 0:
            estimate_loss(model, EVAL_S)
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad, group=ctx.pg)
        opt.step()
        opt.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num > ITERS:
            return iter_num


def _import_what_a_step_imports() -> None:
    """One step of the loop's model and optimizer in the test's thread: torch imports
    modules lazily on an optimizer's first use, and two rank threads importing at once
    wait on the import lock, which a real rank process (its own interpreter) never does
    for another rank."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()


def test_nanogpt_evaluating_before_its_first_step_with_a_setup_section(tmp_path: Path) -> None:
    """Rank 0's 4 s estimate_loss() at iteration 0 against a setup section of 3 s is an
    evaluation (eval timeout 8 s); rank 1 waits for it in its first step: no finding."""
    _import_what_a_step_imports()
    job = ThreadedJob(tmp_path, 2, sets=SETS, pg_timeout_s=15)
    res = job.run(nanogpt_evaluating_first)
    assert res.values() == [ITERS + 1, ITERS + 1]
    assert res.findings == []
    status = res.status
    assert status is not None and status["state"] == "completed"
    for row in status["ranks"]:
        assert row["phase"] == "train"
        assert row["active_findings"] == []
    assert "eval" in status["ranks"][0]["phases_seen"], status["ranks"][0]
    assert "eval" in res.phases_published(0)
    # what the console's first line says of these sections
    line = features_line(LaunchOptions(target="train.py", standalone=True), job.cfg)
    assert "NVRx section timeouts setup 3 s, step 1 s" in line, line
