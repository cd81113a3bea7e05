"""Checkpoints through ``rankguard.checkpoint`` with 2 ranks as processes on gloo
(``run_ranks``): a corrupt newest checkpoint is skipped with a warning and the one
before it loads. The same assertions as the end-to-end run it replaces (which ran the
demo twice under the launcher)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rankguard.checkpoint import CheckpointConfig, CheckpointManager, DataPosition, RNGState
from tests.factories import run_ranks

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(6, 3))
    return {
        "model": model,
        "optim": torch.optim.AdamW(model.parameters(), lr=0.05),
        "data": DataPosition(),
        "rng": RNGState(),
    }


def _save_corrupt_resume(rank: int, world: int, root: Path) -> tuple[int | None, str]:
    config = CheckpointConfig(save=str(root), save_interval=2)
    state = _state()
    manager = CheckpointManager(config, state, job_id="job", session=False)
    for step in range(1, 7):
        loss = state["model"](torch.ones(2, 6)).sum()
        loss.backward()
        state["optim"].step()
        state["data"].index += 1
        manager.maybe_save(step)
    manager.close()
    dist.barrier()
    if rank == 0:  # one byte of rank 1's shard of the newest checkpoint
        shard = root / "step_000000006" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    dist.barrier()
    again = CheckpointManager(config, _state(), job_id="job", session=False)
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        step = again.load_latest()
    again.close()
    return step, said.getvalue()


def test_a_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path) -> None:
    results = run_ranks(2, _save_corrupt_resume, tmp_path / "ckpt", store_dir=tmp_path)
    assert [step for step, _ in results] == [4, 4]
    out = results[0][1]  # rank 0 says it
    assert "checkpoint step 6" in out and "falling back" in out and "corrupt" in out, out
