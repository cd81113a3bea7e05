"""The Lightning callback through a real ``Trainer.fit()``: a tiny LightningModule on
random tokens, CPU, one process; and the entry point ``rankguard run`` relies on.

Lightning is imported by the ``kit`` fixture, not at the top: every test worker collects
this module, and the import costs seconds of CPU (the tests share one worker)."""

from __future__ import annotations

import csv
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.perf.config import PerfConfig
from rankguard.perf.reporter import PerfReporter
from rankguard.rank.identity import ENV
from rankguard.rank.timeline import ProgressTracker
from rankguard.session import Session
from tests.factories import (
    LIGHTNING_FACTORY,
    heartbeat_config,
    lightning_entry_point_installed,
    rank_identity,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.xdist_group("lightning")]

SEQ, VOCAB, BATCH, ACCUM = 8, 32, 4, 2


@pytest.fixture(scope="module")
def kit() -> types.SimpleNamespace:
    """Lightning, rankguard's callback and this module's Lightning classes."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.fabric.plugins import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from rankguard.integrations.lightning import RankguardCallback, callbacks_factory

    class TinyLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, 16)
            self.head = torch.nn.Linear(16, VOCAB)

        def _loss(self, batch: torch.Tensor) -> torch.Tensor:
            logits = self.head(self.emb(batch))
            return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), batch.view(-1))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self._loss(batch)

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Recorder(pl.Callback):
        """Before rankguard's: polls the perf reporter; records the phase in validation."""

        def __init__(self, session: Session) -> None:
            self.session = session
            self.val_phases: set[str] = set()

        def on_train_batch_end(self, *a: Any, **kw: Any) -> None:
            assert self.session.perf is not None
            self.session.perf.poll()

        def on_validation_batch_end(self, *a: Any, **kw: Any) -> None:
            self.val_phases.add(self.session.tracker.phase)

    class RecordingIO(TorchCheckpointIO):  # type: ignore[misc]
        """The phase while Lightning writes a checkpoint file."""

        def __init__(self, session: Session) -> None:
            super().__init__()
            self.session = session
            self.phases: list[str] = []

        def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            self.phases.append(self.session.tracker.phase)
            super().save_checkpoint(*args, **kwargs)

    class _StepOf(torch.nn.Module):
        """A LightningModule's ``training_step`` as a module's forward (for the reference)."""

        def __init__(self, module: pl.LightningModule) -> None:
            super().__init__()
            self.module = module

        def forward(self, batch: torch.Tensor) -> torch.Tensor:
            return self.module.training_step(batch, 0)

    return types.SimpleNamespace(
        pl=pl,
        TinyLM=TinyLM,
        Recorder=Recorder,
        RecordingIO=RecordingIO,
        StepOf=_StepOf,
        ModelCheckpoint=ModelCheckpoint,
        CSVLogger=CSVLogger,
        RankguardCallback=RankguardCallback,
        callbacks_factory=callbacks_factory,
    )


def _loader(n: int) -> torch.utils.data.DataLoader[torch.Tensor]:
    data = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(data, batch_size=BATCH)  # type: ignore[arg-type]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    tracker = ProgressTracker(mode="cpu")
    perf = PerfReporter(
        PerfConfig(log_interval=1), tracker, rank=0, world_size=1, run_id="pl", out_dir=None
    )
    s = Session(
        rank_identity(run_id="pl"),
        tmp_path,
        heartbeat_config(),
        tracker=tracker,
        publish=False,
        perf=perf,
    )
    yield s
    s.close()


def test_fit_phases_progress_batch_and_logs(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    recorder, io = kit.Recorder(session), kit.RecordingIO(session)
    trainer = kit.pl.Trainer(
        max_steps=6,
        accumulate_grad_batches=ACCUM,
        val_check_interval=3 * ACCUM,
        limit_val_batches=2,
        num_sanity_val_steps=1,
        callbacks=[
            recorder,
            kit.RankguardCallback(session),
            kit.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1),
        ],
        plugins=[io],
        logger=kit.CSVLogger(tmp_path / "logs", name="t"),
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    changes: list[str] = []
    tracker = session.tracker
    tracker.on_change = lambda: changes.append(tracker.phase)
    trainer.fit(kit.TinyLM(), _loader(64), _loader(8))

    saves = len(io.phases)
    assert saves >= 3 and io.phases == ["checkpointing"] * saves
    assert recorder.val_phases == {"eval"}
    assert tracker.progress_seq == 6 + saves  # one per optimizer step, one per save
    assert tracker.iteration == 6
    assert changes[:2] == ["eval", "setup"]  # the sanity check, before training
    assert changes[2] == "train" and changes[-1] == "train"
    assert changes.count("eval") == 1 + 2  # sanity check, validation at steps 3 and 6
    assert changes.count("checkpointing") == saves
    assert not tracker.checkpoint_active

    perf = session.perf
    assert perf is not None
    assert perf.global_samples == BATCH * ACCUM and perf.global_tokens == BATCH * ACCUM * SEQ
    assert perf.batch_source is not None and perf.batch_source.startswith("lightning: first batch")

    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    logged = [r for r in rows if r.get("rankguard/step_time_ms")]
    assert logged
    for r in logged:
        assert float(r["rankguard/tokens_per_sec"]) == pytest.approx(
            BATCH * ACCUM * SEQ / (float(r["rankguard/step_time_ms"]) / 1e3), rel=0.01
        )


def test_a_second_instance_stays_idle(
    tmp_path: Path, session: Session, kit: types.SimpleNamespace
) -> None:
    first, second = kit.RankguardCallback(session), kit.RankguardCallback(session)
    trainer = kit.pl.Trainer(
        max_steps=2,
        callbacks=[first, second],
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(kit.TinyLM(), _loader(16))
    assert first.session is session and second.session is None
    assert session.tracker.progress_seq == 2


def test_entry_point_adds_the_callback_under_rankguard_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kit: types.SimpleNamespace
) -> None:
    if not lightning_entry_point_installed():  # installed from an older tree: stand in
        dist = tmp_path / "site" / "rankguard_entry_point_test-0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: rankguard-entry-point-test\nVersion: 0\n"
        )
        # the line of pyproject.toml's [project.entry-points."lightning.pytorch.callbacks_factory"]
        (dist / "entry_points.txt").write_text(
            f"[lightning.pytorch.callbacks_factory]\nrankguard = {LIGHTNING_FACTORY}\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in (ENV.LAUNCHER, ENV.RUN_DIR):
        monkeypatch.delenv(name, raising=False)
    assert kit.callbacks_factory() == []
    plain = kit.pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert not any(isinstance(cb, kit.RankguardCallback) for cb in plain.callbacks)

    monkeypatch.setenv(ENV.LAUNCHER, "1")
    monkeypatch.setenv(ENV.RUN_DIR, str(tmp_path))
    under_run = kit.pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert sum(isinstance(cb, kit.RankguardCallback) for cb in under_run.callbacks) == 1


def test_pyproject_declares_the_entry_point() -> None:
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[3]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    factories = project["entry-points"]["lightning.pytorch.callbacks_factory"]
    assert factories == {"rankguard": "rankguard.integrations.lightning:callbacks_factory"}
    assert project["optional-dependencies"]["lightning"]


def test_flops_measured_on_the_first_training_step_and_the_parameters_dtype(
    session: Session, kit: types.SimpleNamespace
) -> None:
    from rankguard.perf.measured import measured_flops_per_step

    model = kit.TinyLM()
    trainer = kit.pl.Trainer(
        max_steps=3,
        accumulate_grad_batches=ACCUM,
        callbacks=[kit.RankguardCallback(session)],
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, _loader(64))
    perf = session.perf
    assert perf is not None
    batch = next(iter(_loader(64)))
    one_micro_batch = measured_flops_per_step(kit.StepOf(model), (batch,))
    # forward and backward of each micro-batch of the first optimizer step, world size 1
    assert perf.flops_per_step == pytest.approx(ACCUM * one_micro_batch, rel=1e-6)
    assert perf.flops_source.startswith("measured: FlopCounterMode over the first training_step")
    assert perf.model_dtype == "fp32"
    assert perf.model_dtype_source == "lightning: parameters of TinyLM"
    assert perf.summary()["session_info"]["dtype"] == "fp32"
    assert session.tracker.shown_iteration() == (3, "script")  # trainer.global_step
