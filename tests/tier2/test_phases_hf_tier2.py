"""Ranks as threads: the Hugging Face Trainer, as installed, in each rank's thread, from a
script that never imports rankguard: a slow evaluation (``compute_metrics``) and a slow
save (a callback copying the checkpoint to remote storage), each longer than the progress
timeout, recognised from each rank's own stack (the Trainer's evaluate and save
functions, as named in the installed transformers): no finding. The same assertions as
the end-to-end run this replaces (progress 3 s, each slow part 4 s), with the timeouts
scaled to seconds (progress 1 s, each slow part 1.3 s). The Trainer under a real
launch, with rankguard's callback: ``tests/e2e/test_integrations_e2e.py``."""

from __future__ import annotations

import os
import threading
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
STEPS = 6


@pytest.fixture(autouse=True)
def _environ_as_found() -> Iterator[None]:
    """A training run adds variables to ``os.environ`` (seen after the HF Trainer and
    Lightning: ``PYTORCH_NVML_BASED_CUDA_CHECK``, ``TORCHINDUCTOR_CACHE_DIR``): the tests
    that run after this one in the worker find it as it was."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int = 16, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def hf_trainer(out: Path, slow_s: float = SLOW_S) -> Any:
    """``scripts/hf_trainer.py``'s Trainer (a tiny GPT-2 from a config, random tokens,
    evaluated and saved at its last step, each taking ``slow_s`` more) for one rank's
    thread."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        time.sleep(slow_s)  # e.g. a slow external scorer
        return {"n": float(len(eval_pred.label_ids))}

    class UploadCheckpoint(TrainerCallback):
        """Copies every saved checkpoint to remote storage (slow)."""

        def on_save(self, args_: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(slow_s)

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    training_args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=STEPS,
        save_strategy="steps",
        save_steps=STEPS,
        logging_steps=STEPS,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return Trainer(
        model=GPT2LMHeadModel(config),
        args=training_args,
        train_dataset=RandomTokens(256),
        eval_dataset=RandomTokens(16, seed=1),
        compute_metrics=compute_metrics,
        callbacks=[UploadCheckpoint()],
    )


def test_hf_trainer_slow_eval_and_save(tmp_path: Path) -> None:
    """Each rank's Trainer evaluates and saves for 1.3 s each at step 6 against a
    progress timeout of 1 s: no finding; every rank's phases seen from its own stack."""
    skip_unless_installed("transformers", "accelerate")
    hf_trainer(tmp_path / "warm", slow_s=0).train()  # the Trainer's lazy imports, once

    # Ranks as threads share one process, and so Accelerate's process-wide state: a
    # Trainer's arguments reset it (``AcceleratorState._reset_state``) and build it again
    # when they first set up the device, so a Trainer built while another thread trains
    # took that one's state from under it (``AcceleratorState`` object has no attribute
    # ``distributed_type``, 1 CI run in many). Each rank builds its own in turn, and none
    # trains before both are built: what separate processes get by themselves.
    build, built = threading.Lock(), threading.Barrier(2, timeout=60)

    def rank(ctx: RankContext) -> int:
        ctx.session.install_optimizer_hook()  # what the rank bootstrap does
        with build:
            trainer = hf_trainer(tmp_path / f"hf_{ctx.rank}")
            assert trainer.args.device.type == "cpu"  # the device set-up (the reset) here
        built.wait()
        trainer.train()
        return int(trainer.state.global_step)

    job = ThreadedJob(tmp_path / "logs", 2, sets=("heartbeat.eval_timeout_s=5",), pg_timeout_s=15)
    res = job.run(rank)
    assert res.values() == [STEPS, STEPS]
    res.assert_healthy({"eval", "checkpointing", "train"})
