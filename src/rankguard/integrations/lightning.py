"""PyTorch Lightning integration: a ``Callback`` that ``rankguard run`` adds to every
``lightning.pytorch.Trainer`` by itself.

Install with ``pip install 'rankguard[lightning]'``: the package then declares the entry
point ``lightning.pytorch.callbacks_factory`` (Lightning's public mechanism for external
callbacks), whose :func:`callbacks_factory` returns a :class:`RankguardCallback` in a
rank started by ``rankguard run`` and nothing elsewhere. Without the installed entry point
(or under plain torchrun), add it yourself: ``Trainer(callbacks=[RankguardCallback()])``;
a second instance in the same ``Trainer`` stays idle.

What it does, over the in-loop API of the process's session (``rankguard.init()``):

- progress: ``step_end(global_step)`` at the ``on_train_batch_end`` where
  ``trainer.global_step`` moved (one optimizer step, whatever ``accumulate_grad_batches``);
  the optimizer hook stops counting at ``on_train_start``: the trainer's global step is
  the one numbering of perf lines, status and summary;
- phases: ``train`` from ``on_train_start``; ``eval`` from ``on_validation_start`` to
  ``on_validation_end`` (the sanity check included), then back; ``checkpointing`` from
  ``on_save_checkpoint``, which Lightning calls while it builds the checkpoint, BEFORE it
  writes the file. Lightning has no "after save" event; the checkpoint ends at this
  callback's next event (the next batch, validation, epoch start or end, train end):
  ``ModelCheckpoint`` callbacks always run last, so the write is inside;
- batch: the first batch's first tensor (``shape[0]`` samples; tokens when it is 2-D token
  ids) x ``accumulate_grad_batches`` x ``trainer.world_size``;
- FLOPs: Megatron's formula when the LightningModule or one of its sub-modules has a known
  ``config``; else measured on the first optimizer step itself: ``FlopCounterMode`` from
  its first ``on_train_batch_start`` to ``on_before_optimizer_step`` (the
  ``training_step``, forward and backward, of every micro-batch of that step) x
  ``trainer.world_size`` (``perf.measured.StepFlopCounter``); the dtype the report shows
  is that of the module's parameters;
- logs: ``rankguard/tokens_per_sec``, ``rankguard/samples_per_sec``,
  ``rankguard/tflops_per_gpu``, ``rankguard/mfu``, ``rankguard/step_time_ms`` through
  ``pl_module.log_dict`` (so ``trainer.logger``), once per new perf window.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rankguard.integrations.lightning needs lightning: pip install 'rankguard[lightning]'"
    ) from exc

from rankguard.integrations.common import (
    analytic_from_config,
    perf_logs,
    resolve_session,
    set_batch,
)
from rankguard.perf.autodetect import input_shape, note_model_dtype
from rankguard.perf.measured import StepFlopCounter
from rankguard.rank import runenv
from rankguard.rank.ranksession import RankSession

__all__ = ["RankguardCallback", "callbacks_factory"]

EVAL_PHASE = "eval"
TRAIN_PHASE = "train"


def callbacks_factory() -> list[pl.Callback]:
    """Lightning's ``lightning.pytorch.callbacks_factory`` entry point: the callback in a
    rank of ``rankguard run``, nothing elsewhere."""
    if runenv.current().monitored:
        return [RankguardCallback()]
    return []


class RankguardCallback(pl.Callback):
    """Phases, progress, batch, FLOPs and perf logs of a ``lightning.pytorch.Trainer``."""

    def __init__(self, session: RankSession | None = None) -> None:
        self._given = session
        self.session: RankSession | None = None
        self._last_step = 0
        self._batch_set = False
        self._saving = False
        self._phase_before_eval: str | None = None
        self._last_logged: object = None  # the perf window last logged (by identity)
        self._flops: StepFlopCounter | None = None  # counting the first optimizer step

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        callbacks: list[pl.Callback] = getattr(trainer, "callbacks", [self])
        first = next(cb for cb in callbacks if isinstance(cb, RankguardCallback))
        if first is not self:  # the entry point's and the user's: one is enough
            return
        session = resolve_session(self._given)
        self.session = session if session.enabled else None
        self._last_step = trainer.global_step
        if self.session is not None and self.session.perf is not None:
            note_model_dtype(self.session.perf, pl_module, "lightning")

    # ---- training -------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        session = self.session
        if session is not None:
            # the trainer's global step numbers every step from here: the optimizer
            # hook's count stops before the first optimizer step (it counted that
            # step a second time, and every perf line was one iteration behind)
            session.take_over_progress()
            self._end_save(session)
            session.set_phase(TRAIN_PHASE)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        session = self.session
        if session is None:
            return
        self._end_save(session)
        if not self._batch_set:
            self._set_batch(session, trainer, pl_module, batch)
            perf = session.perf
            if perf is not None and perf.flops_per_step is None:
                self._flops = StepFlopCounter()
                self._flops.start()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self._flops is not None:
            self._count_flops(trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        session = self.session
        if session is None:
            return
        step = trainer.global_step
        if step == self._last_step:  # a micro-batch of gradient accumulation
            return
        if self._flops is not None:  # manual optimization: no on_before_optimizer_step
            self._count_flops(trainer)
        self._last_step = step
        session.step_end(step)
        extra = perf_logs(session, self._last_logged)
        if extra:
            self._last_logged = session.perf.latest if session.perf is not None else None
            pl_module.log_dict(extra, on_step=True, on_epoch=False, batch_size=1)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self._end_save(self.session)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self._end_save(self.session)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self._end_save(self.session)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.session is not None:
            self._end_save(self.session)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        counter, self._flops = self._flops, None
        if counter is not None:
            counter.stop()
        if self.session is not None:
            self._end_save(self.session)

    # ---- validation and checkpoints ---------------------------------------------------

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        session = self.session
        if session is None:
            return
        self._end_save(session)
        self._phase_before_eval = session.current_phase
        session.set_phase(EVAL_PHASE)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        session = self.session
        if session is None:
            return
        previous, self._phase_before_eval = self._phase_before_eval, None
        session.set_phase(previous or TRAIN_PHASE)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        session = self.session
        if session is None:
            return
        session.checkpoint_start(f"step_{trainer.global_step}")
        self._saving = True

    def _end_save(self, session: RankSession) -> None:
        if self._saving:
            self._saving = False
            session.checkpoint_end()

    # ---- perf -------------------------------------------------------------------------

    def _set_batch(
        self, session: RankSession, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any
    ) -> None:
        self._batch_set = True
        shape = input_shape((batch,))
        if shape is None or session.perf is None:
            return
        micro, world = int(trainer.accumulate_grad_batches), int(trainer.world_size)
        set_batch(
            session,
            shape,
            micro_batches=micro,
            data_parallel_size=world,
            source=(
                f"lightning: first batch {shape.samples} x {shape.seq} x accumulate_grad_batches"
                f" {micro} x world_size {world}"
            ),
        )
        analytic_from_config(session, pl_module, shape, shape.samples * micro * world)

    def _count_flops(self, trainer: pl.Trainer) -> None:
        """The first optimizer step's FLOPs, counted while it ran, for the global batch."""
        counter, self._flops = self._flops, None
        assert counter is not None
        per_replica = counter.stop()
        session = self.session
        perf = session.perf if session is not None else None
        if per_replica is None or perf is None or perf.flops_per_step is not None:
            return
        world = int(trainer.world_size)
        perf.set_flops(
            per_replica * world,
            f"measured: FlopCounterMode over the first training_step (forward and backward) "
            f"x world_size {world}",
        )
