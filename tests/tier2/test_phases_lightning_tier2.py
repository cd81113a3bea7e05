"""Ranks as threads: a Lightning script, unmodified for rankguard, in each rank's thread:
a slow validation set and extra state saved with every checkpoint, each longer than the
progress timeout, recognised from each rank's own stack (Lightning's loops and
``ModelCheckpoint``, as installed), with Megatron-style section timeouts: no finding.
The same assertions as the end-to-end run this replaces (progress 3 s, each slow part
4 s), with the timeouts scaled to seconds (progress 1 s, each slow part 1.3 s). Lightning
under a real launch, its callback from the entry point: ``tests/e2e/
test_integrations_e2e.py``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.factories import skip_unless_installed
from tests.harness import RankContext, ThreadedJob

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(90)]

SLOW_S = 1.3
STEPS, VAL_EVERY = 6, 3
SETS = (
    "heartbeat.eval_timeout_s=5",
    # Megatron's launch line, scaled down (setup, step, checkpointing; out of section)
    "fault_tolerance.rank_section_timeouts={setup: 10, step: 1, checkpointing: 5}",
    "fault_tolerance.rank_out_of_section_timeout=5",
)


@pytest.fixture(autouse=True)
def _environ_as_found() -> Iterator[None]:
    """A training run adds variables to ``os.environ`` (seen after the HF Trainer and
    Lightning: ``PYTORCH_NVML_BASED_CUDA_CHECK``, ``TORCHINDUCTOR_CACHE_DIR``): the tests
    that run after this one in the worker find it as it was."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def lightning_fit(root: Path, slow_s: float = SLOW_S) -> int:
    """``scripts/lightning_module.py``'s regressor, fitted on one CPU device, each
    validation and save taking ``slow_s`` more; the global step it ended at."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    class SlowValidationSet(Dataset):
        def __init__(self, n: int = 8) -> None:
            self.x = torch.randn(n, 8)
            self.y = torch.randn(n, 1)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> Any:
            time.sleep(slow_s / len(self.x))  # a remote dataset
            return self.x[i], self.y[i]

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            time.sleep(slow_s)  # e.g. a tokenizer snapshot written alongside
            checkpoint["extra"] = {"saved_at": time.time()}

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    train = DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=8)
    val = DataLoader(SlowValidationSet(), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        val_check_interval=VAL_EVERY,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        callbacks=[ModelCheckpoint(every_n_train_steps=VAL_EVERY, save_top_k=-1)],
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), train, val)
    return int(trainer.global_step)


def test_lightning_slow_validation_and_checkpoint_megatron_sections(tmp_path: Path) -> None:
    """Each rank validates and saves for 1.3 s each at steps 3 and 6 against a progress
    timeout of 1 s and a step section of 1 s: no finding; every rank's phases seen from
    its own stack."""
    skip_unless_installed("lightning")
    lightning_fit(tmp_path / "warm", slow_s=0)  # Lightning's lazy imports, once, here

    def rank(ctx: RankContext) -> int:
        ctx.session.install_optimizer_hook()  # what the rank bootstrap does
        return lightning_fit(tmp_path / f"pl_{ctx.rank}")

    job = ThreadedJob(tmp_path / "logs", 2, sets=SETS, pg_timeout_s=15)
    res = job.run(rank)
    assert res.values() == [STEPS, STEPS]
    res.assert_healthy({"eval", "checkpointing", "train"})
