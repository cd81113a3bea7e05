"""Ranks as threads: evaluation and saving recognised from each rank's own stack (an
unmodified nanoGPT-style loop: ``estimate_loss()``, ``torch.save`` to a slow disk, the
optimizer hook for progress), each longer than the progress timeout: no finding; a hang
inside an evaluation is found by the eval timeout and named with its phase. The same
assertions as the end-to-end runs they replace, with the timeouts scaled to seconds
(progress 1 s, each slow part 1.3 s)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import JobResult, RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]

SLOW_S = 1.3
PHASES = ("heartbeat.eval_timeout_s=5",)
# Megatron's launch line, scaled down as the e2e test did it (setup, step, checkpointing)
MEGATRON = (
    "fault_tolerance.rank_section_timeouts={setup: 10, step: 1, checkpointing: 5}",
    "fault_tolerance.rank_out_of_section_timeout=5",
)


class SlowDisk(io.BytesIO):
    """A busy network filesystem: the first writes take ``budget`` seconds in all."""

    def __init__(self, budget: float) -> None:
        super().__init__()
        self.budget = budget

    def write(self, b: Any) -> int:
        pause = min(self.budget, SLOW_S / 4)
        self.budget -= pause
        time.sleep(pause)
        return super().write(b)


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, seconds: float) -> float:
    """nanoGPT's evaluation, by name: a big validation set takes ``seconds``."""
    losses = []
    for _ in range(4):
        time.sleep(seconds / 4)
        losses.append(float(model(torch.ones(2, 4)).sum()))
    return sum(losses) / len(losses)


def nanogpt_style(
    iters: int, eval_interval: int, eval_s: float, save_s: float, *, everyone: bool = False
) -> Callable[[RankContext], int]:
    """The script's loop, unmodified: progress from the optimizer hook; rank 0 (or every
    rank) evaluates and saves at ``eval_interval`` while the others wait in the next
    step's gradient all-reduce."""

    def train(ctx: RankContext) -> int:
        ctx.session.install_optimizer_hook()  # what the rank bootstrap does
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        iter_num = 0
        while True:
            if iter_num % eval_interval == 0 and iter_num > 0 and (everyone or ctx.rank == 0):
                estimate_loss(model, eval_s)
                torch.save({"model": model.state_dict(), "iter_num": iter_num}, SlowDisk(save_s))
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad, group=ctx.pg)
            opt.step()
            opt.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num > iters:
                return iter_num

    return train


def _assert_healthy(res: JobResult) -> dict[str, Any]:
    assert res.findings == []
    status = res.status
    assert status is not None and status["state"] == "completed"
    for row in status["ranks"]:
        assert row["phase"] == "train"
        assert row["active_findings"] == []
    return status


@pytest.mark.parametrize("sets", [PHASES, PHASES + MEGATRON], ids=["plain", "megatron_sections"])
def test_nanogpt_style_rank0_evaluates_and_saves_alone(
    tmp_path: Path, sets: tuple[str, ...], capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 alone runs estimate_loss() and torch.save (1.3 s each) while rank 1 waits
    in the next step's all-reduce: rank 1 is blocked by rank 0, nobody is hung."""
    job = ThreadedJob(tmp_path, 2, sets=sets, pg_timeout_s=15)
    res = job.run(nanogpt_style(12, 10, SLOW_S, SLOW_S))
    assert res.values() == [13, 13]
    status = _assert_healthy(res)
    # the script never says its iter_num: the optimizer steps counted, said as such
    assert {(r["iteration"], r["iteration_source"]) for r in status["ranks"]} == {(13, "steps")}
    assert "incl. start-up (warm-up)" in capfd.readouterr().out  # first perf window
    assert {"eval", "checkpointing", "train"} <= set(status["ranks"][0]["phases_seen"])
    assert {"eval", "checkpointing"} <= res.phases_published(0)
    # closing: the session's close after the script returned, published when it lasts
    assert res.phases_published(1) <= {"setup", "train", "closing"}
    # step times leave the evaluation and the save out (perf monitor, rank 0)
    (summary_path,) = (tmp_path / "perf_monitor" / job.run_id).glob("perf_summary_*.json")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    assert summary["session_info"]["steps_with_eval_or_save"] >= 1
    assert summary["final_statistics"]["max_step_time_ms"] < 1000


def test_every_rank_evaluates_and_saves(tmp_path: Path) -> None:
    """Both ranks evaluate and save at once (the demo's --eval-every/--checkpoint-every
    with slow parts): each rank's own stack names its phases."""
    job = ThreadedJob(tmp_path, 2, sets=PHASES, pg_timeout_s=15)
    res = job.run(nanogpt_style(8, 8, SLOW_S, SLOW_S, everyone=True))
    status = _assert_healthy(res)
    for rank in (0, 1):
        assert {"eval", "checkpointing", "train"} <= set(status["ranks"][rank]["phases_seen"])


def test_hang_inside_eval_is_found_by_the_eval_timeout(tmp_path: Path) -> None:
    """estimate_loss() on rank 0 takes 2.5 s against an eval timeout of 1 s: one
    finding, for rank 0, in phase eval; rank 1, waiting for it, is not reported."""
    job = ThreadedJob(tmp_path, 2, sets=("heartbeat.eval_timeout_s=1",), pg_timeout_s=15)
    res = job.run(nanogpt_style(11, 10, 2.5, 0.0))
    assert res.values() == [12, 12]
    findings = res.findings
    assert [(f["rank"], f["finding_type"], f["phase"]) for f in findings] == [
        (0, "gpu_progress_timeout", "eval")
    ]
    assert findings[0]["timeout_s"] == 1.0
    assert "phase eval" in findings[0]["message"]
