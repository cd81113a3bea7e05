"""The Hugging Face callback through a real ``Trainer.train()``: a tiny GPT-2 built from a
config (no download), random tokens, CPU, one process.

transformers is imported by the ``kit`` fixture, not at the top: every test worker
collects this module, and the import costs seconds of CPU (the tests share one worker)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.perf.config import PerfConfig
from rankguard.perf.flops import ModelShape, analytic_flops_per_step
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.timeline import ProgressTracker
from rankguard.session import NullSession, Session
from tests.factories import heartbeat_config, rank_identity

pytestmark = [pytest.mark.timeout(60), pytest.mark.xdist_group("hf")]

SEQ, VOCAB, BATCH, ACCUM = 16, 64, 4, 2


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    tracker = ProgressTracker(mode="cpu")
    perf = PerfReporter(
        PerfConfig(log_interval=2), tracker, rank=0, world_size=1, run_id="hf", out_dir=None
    )
    s = Session(
        rank_identity(run_id="hf"),
        tmp_path,
        heartbeat_config(),
        tracker=tracker,
        publish=False,
        perf=perf,
    )
    yield s
    s.close()


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.fixture(scope="module")
def kit() -> types.SimpleNamespace:
    """transformers, rankguard's callback and this module's Trainer classes."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it (the hf extra installs both)
    from rankguard.integrations.hf import RankguardCallback

    class Recorder(transformers.TrainerCallback):  # type: ignore[misc]
        """Before rankguard's: polls the perf reporter so a window exists at each log, and
        records the phase during evaluation."""

        def __init__(self, session: Session) -> None:
            self.session = session
            self.eval_phases: set[str] = set()

        def on_log(self, *a: Any, **kw: Any) -> None:
            assert self.session.perf is not None
            self.session.perf.poll()

        def on_prediction_step(self, *a: Any, **kw: Any) -> None:
            self.eval_phases.add(self.session.tracker.phase)

    class SavingTrainer(transformers.Trainer):  # type: ignore[misc]
        """Records the phase while the Trainer writes a checkpoint (``save_model`` is called
        by its checkpoint save)."""

        phases_in_save: list[str]
        session: Session

        def save_model(self, *args: Any, **kwargs: Any) -> None:
            self.phases_in_save.append(self.session.tracker.phase)
            super().save_model(*args, **kwargs)

    return types.SimpleNamespace(
        transformers=transformers,
        Recorder=Recorder,
        SavingTrainer=SavingTrainer,
        RankguardCallback=RankguardCallback,
    )


def _trainer(
    kit: types.SimpleNamespace, tmp_path: Path, session: Session, **overrides: Any
) -> tuple[Any, Any]:
    config = kit.transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = kit.transformers.GPT2LMHeadModel(config)
    args = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        max_steps=8,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="steps",
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    args.update(overrides)
    recorder = kit.Recorder(session)
    trainer = kit.SavingTrainer(
        model=model,
        args=kit.transformers.TrainingArguments(**args),
        train_dataset=Tokens(64),
        eval_dataset=Tokens(8),
        callbacks=[recorder, kit.RankguardCallback(session)],
    )
    trainer.session = session
    trainer.phases_in_save = []
    return trainer, recorder


def test_train_eval_save_phases_progress_batch_flops_and_logs(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    trainer, recorder = _trainer(kit, tmp_path, session)
    changes: list[str] = []
    tracker = session.tracker
    tracker.on_change = lambda: changes.append(tracker.phase)
    trainer.train()

    # one progress step per optimizer step, plus one per finished save (steps 3, 6, 8)
    assert tracker.progress_seq == 8 + 3
    assert tracker.iteration == 8
    assert len(tracker.checkpoint_durations_ns) == 3
    assert trainer.phases_in_save == ["checkpointing"] * 3
    assert recorder.eval_phases == {"eval"}
    assert changes == [
        "train",
        "checkpointing",
        "train",  # step 3
        "eval",
        "train",  # step 4
        "checkpointing",
        "train",  # step 6
        "eval",
        "train",
        "checkpointing",
        "train",  # step 8: evaluate, then save
    ]

    perf = session.perf
    assert perf is not None
    assert perf.global_samples == BATCH * ACCUM and perf.global_tokens == BATCH * ACCUM * SEQ
    assert perf.batch_source is not None and perf.batch_source.startswith("hf: Trainer arguments")
    shape = ModelShape(
        family="gpt",
        num_layers=2,
        hidden_size=32,
        seq_length=SEQ,
        vocab_size=VOCAB,
        num_attention_heads=2,
    )
    assert perf.flops_per_step == analytic_flops_per_step(shape, BATCH * ACCUM)
    assert perf.flops_source.startswith("analytic: gpt formula from GPT2LMHeadModel.config")

    logged = [h for h in trainer.state.log_history if "rankguard/tokens_per_sec" in h]
    assert logged and all("loss" in h for h in logged)
    for h in logged:
        assert h["rankguard/tokens_per_sec"] == pytest.approx(
            BATCH * ACCUM * SEQ / (h["rankguard/step_time_ms"] / 1e3), rel=0.01
        )
        assert h["rankguard/tflops_per_gpu"] > 0
    assert not any("rankguard/mfu" in h for h in logged)  # CPU: no peak, no MFU


def test_total_flos_when_the_config_is_unknown(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    trainer, _ = _trainer(
        kit, tmp_path, session, eval_strategy="no", save_strategy="no", max_steps=4
    )
    trainer.model.config.model_type = "unknown-model"
    trainer.train()
    perf = session.perf
    assert perf is not None
    assert perf.flops_source.startswith("hf: Trainer total_flos")
    # the Trainer's own 6 x non-embedding parameters x tokens per step
    n = trainer.model.num_parameters(exclude_embeddings=True)
    assert perf.flops_per_step == pytest.approx(6 * n * BATCH * ACCUM * SEQ, rel=1e-6)


def test_a_long_save_is_a_checkpoint_not_a_hang(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    """No 'before save' event exists: the phase comes from control.should_save at
    on_step_end, so the whole write is inside the checkpoint, whatever it takes."""
    trainer, _ = _trainer(kit, tmp_path, session, eval_strategy="no", max_steps=3)
    seen: list[tuple[str, float]] = []
    original = trainer.save_model

    def slow_save(*args: Any, **kwargs: Any) -> None:
        import time

        time.sleep(0.5)
        snap = session.tracker.snapshot()
        seen.append((snap["phase"], snap["since_progress_s"]))
        original(*args, **kwargs)

    trainer.save_model = slow_save
    trainer.train()
    assert [phase for phase, _ in seen] == ["checkpointing"]
    assert seen[0][1] >= 0.5  # no progress during the save: the checkpoint timeout applies
    assert session.tracker.phase == "train" and not session.tracker.checkpoint_active


def test_no_op_outside_a_launcher(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    trainer, _ = _trainer(
        kit, tmp_path, session, max_steps=2, eval_strategy="no", save_strategy="no"
    )
    trainer.pop_callback(kit.RankguardCallback)
    callback = kit.RankguardCallback(NullSession())
    trainer.add_callback(callback)
    trainer.train()
    assert callback._live is None
    assert session.tracker.progress_seq == 0 and session.tracker.phase == "setup"


def test_inserted_first_the_reporting_callbacks_see_the_keys(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    """As docs/integrations.md says: right after DefaultFlowCallback, before the
    callbacks ``report_to`` adds, those get rankguard's keys in the same ``logs``."""

    class Reporter(kit.transformers.TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.keys: set[str] = set()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            self.keys |= set(logs or {})

    trainer, recorder = _trainer(
        kit, tmp_path, session, max_steps=6, eval_strategy="no", save_strategy="no"
    )
    handler = trainer.callback_handler
    handler.remove_callback(kit.RankguardCallback)
    handler.remove_callback(recorder)
    reporter = Reporter()
    handler.callbacks.insert(1, reporter)  # where report_to's callbacks are
    handler.callbacks.insert(1, kit.RankguardCallback(session))
    handler.callbacks.insert(1, recorder)
    trainer.train()
    assert "rankguard/tokens_per_sec" in reporter.keys
