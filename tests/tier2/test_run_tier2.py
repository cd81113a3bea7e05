"""Ranks as threads: what node 0's monitor finds in a 2-rank job (a rank stalled in its
step, a save longer than the progress timeout). The same assertions as the end-to-end
runs they replace, with the timeouts scaled to seconds."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.harness import RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(60)]


def test_rank_blocked_in_its_step_is_a_progress_timeout_for_that_rank_only(
    tmp_path: Path,
) -> None:
    job = ThreadedJob(tmp_path, 2, pg_timeout_s=15)
    job.faults.fail_at(1, 5, "stall", seconds=2.5)
    res = job.run(lambda ctx: ctx.train(20))
    assert res.values() == [20, 20]
    found = res.findings
    assert [(f["finding_type"], f["rank"]) for f in found] == [("gpu_progress_timeout", 1)]
    f = found[0]
    assert f["process_liveness"] == "alive"
    assert f["gpu_progress"] == "stalled"
    assert f["reason"] == "rank_alive_but_gpu_progress_not_advancing"
    assert f["observed_s"] > f["timeout_s"] == 1


def _save_slowly(ckpt_dir: Path):  # type: ignore[no-untyped-def]
    """Every 4 steps rank 0 saves with ``torch.save`` inside ``session.checkpoint()``
    and every rank spends 1.6 s there (a slower disk: longer than the progress timeout).
    """

    def on_step(ctx: RankContext, step: int) -> None:
        if step % 4:
            return
        with ctx.session.checkpoint(f"step_{step}"):
            if ctx.rank == 0:
                path = ckpt_dir / f"step_{step:09d}"
                path.mkdir(parents=True)
                torch.save({"step": step}, path / "model.pt")
                (path / "COMMITTED").write_text("")
            time.sleep(1.6)

    return lambda ctx: ctx.train(8, on_step=on_step)


def test_checkpoint_longer_than_progress_timeout_is_not_a_finding(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2, pg_timeout_s=15)
    res = job.run(_save_slowly(tmp_path / "ckpt"))
    assert res.values() == [8, 8]
    assert res.findings == []
    assert res.status is not None and res.status["state"] == "completed"
    phases = Counter(
        (r["phase"], r["checkpoint_active"]) for rank in (0, 1) for r in res.heartbeats(rank)
    )
    assert phases[("checkpointing", True)] >= 4  # seen while saving, on both ranks
    assert (tmp_path / "ckpt" / "step_000000008" / "COMMITTED").exists()
