"""Hugging Face ``Trainer`` integration: ``Trainer(..., callbacks=[RankguardCallback()])``.

Install with ``pip install 'rankguard[hf]'``. transformers has no public registry that
would let ``rankguard run`` add a callback to every ``Trainer`` (``report_to`` names only
transformers' own integrations), so this one line is the way in.

What it does, over the in-loop API of the process's session (``rankguard.init()``):

- progress: ``step_end(global_step)`` at each ``on_step_end`` (one optimizer step);
- phases: ``train`` from ``on_train_begin``; ``eval`` and ``checkpointing`` BEFORE the
  work starts. The Trainer has no "before evaluate" or "before save" event: ``on_evaluate``
  and ``on_save`` fire after the fact. But it decides at ``on_step_end`` (and
  ``on_epoch_end``): its ``DefaultFlowCallback``, always first in the list, sets
  ``control.should_evaluate`` and ``control.should_save`` there, and the Trainer then
  evaluates and saves right after the callbacks return. So this callback reads those flags
  at ``on_step_end``: it enters ``eval`` (until ``on_evaluate``) or starts the checkpoint
  (until ``on_save``); a save that follows an evaluation starts at ``on_evaluate``. An
  evaluation called outside training (``trainer.evaluate()``) enters ``eval`` at its first
  ``on_prediction_step``. Not seen: a save decided after evaluation by
  ``save_strategy="best"`` and ``trainer.save_model()`` called by the script (no event).
- batch: ``per_device_train_batch_size x gradient_accumulation_steps`` samples per replica
  and step, ``world_size`` replicas, tokens x the sequence length of the first batch (one
  forward pre-hook on the model for its first call, then removed);
- FLOPs: Megatron's formula when the model's config is known (GPT-2, Llama, Mistral,
  Qwen2/3), else the Trainer's own ``total_flos`` per step (its ``6 x parameters x
  tokens``) at the first log;
- logs: ``rankguard/tokens_per_sec``, ``rankguard/samples_per_sec``,
  ``rankguard/tflops_per_gpu``, ``rankguard/mfu``, ``rankguard/step_time_ms`` added to
  the Trainer's training logs (its ``log_history``, console and the callbacks after this
  one; reporting callbacks named in ``report_to`` come before user callbacks in the
  Trainer's list and see the keys only if this callback is inserted before them).

Outside ``rankguard run`` and torchrun every call is a no-op.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rankguard.integrations.hf needs transformers: pip install 'rankguard[hf]'"
    ) from exc

from rankguard.integrations.common import (
    analytic_from_config,
    perf_logs,
    resolve_session,
    set_batch,
)
from rankguard.perf.autodetect import InputProbe, note_model_dtype
from rankguard.rank.ranksession import RankSession

__all__ = ["RankguardCallback"]

EVAL_PHASE = "eval"
TRAIN_PHASE = "train"


class RankguardCallback(TrainerCallback):
    """Phases, progress, batch, FLOPs and perf logs of a ``transformers.Trainer``."""

    def __init__(self, session: RankSession | None = None) -> None:
        self._given = session
        self.session: RankSession | None = None
        self._probe: InputProbe | None = None
        self._training = False
        self._save_after_eval = False
        self._batch_set = False
        self._last_logged: object = None  # the perf window last logged (by identity)

    @property
    def _live(self) -> RankSession | None:
        session = self.session
        if session is None:
            session = self.session = resolve_session(self._given)
        return session if session.enabled else None

    # ---- training -------------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        session = self._live
        if session is None:
            return
        self._training = True
        session.set_phase(TRAIN_PHASE)
        if model is not None and session.perf is not None:
            note_model_dtype(session.perf, model, "hf")
        if model is not None and session.perf is not None and not self._batch_set:
            self._probe = InputProbe(model)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        session = self._live
        if session is None:
            return
        session.step_end(state.global_step)
        if self._probe is not None:
            self._set_batch(session, args)
        self._before_log_save_evaluate(session, state, control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        session = self._live
        if session is not None:
            self._before_log_save_evaluate(session, state, control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._training = False
        if self._probe is not None:
            self._probe.remove()
            self._probe = None

    # ---- evaluation and saving --------------------------------------------------------

    def _before_log_save_evaluate(
        self, session: RankSession, state: TrainerState, control: TrainerControl
    ) -> None:
        """The Trainer evaluates, then saves, right after these callbacks return."""
        if control.should_evaluate:
            session.set_phase(EVAL_PHASE)
            self._save_after_eval = bool(control.should_save)
        elif control.should_save:
            session.checkpoint_start(f"checkpoint-{state.global_step}")

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        session = self._live
        if session is not None and session.current_phase not in (EVAL_PHASE, "checkpointing"):
            session.set_phase(EVAL_PHASE)  # trainer.evaluate() / predict() outside training

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        session = self._live
        if session is None:
            return
        session.set_phase(TRAIN_PHASE if self._training else "setup")
        if self._training and (self._save_after_eval or control.should_save):
            session.checkpoint_start(f"checkpoint-{state.global_step}")
        self._save_after_eval = False

    def on_predict(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Any = None,
        **kw: Any,
    ) -> None:
        session = self._live
        if session is not None:
            session.set_phase(TRAIN_PHASE if self._training else "setup")

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        session = self._live
        if session is not None:
            session.checkpoint_end()

    # ---- perf -------------------------------------------------------------------------

    def _set_batch(self, session: RankSession, args: TrainingArguments) -> None:
        probe, self._probe = self._probe, None
        assert probe is not None
        probe.remove()
        shape = probe.shape
        if shape is None:
            return
        shape.samples = int(args.per_device_train_batch_size)
        micro, world = int(args.gradient_accumulation_steps), int(args.world_size)
        set_batch(
            session,
            shape,
            micro_batches=micro,
            data_parallel_size=world,
            source=(
                f"hf: Trainer arguments (per_device_train_batch_size {shape.samples} x "
                f"gradient_accumulation_steps {micro} x world_size {world}), sequence length "
                f"{shape.seq} of the first batch"
            ),
        )
        self._batch_set = True
        analytic_from_config(session, probe.module, shape, shape.samples * micro * world)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        session = self._live
        if session is None or logs is None or not self._training:
            return
        perf = session.perf
        if (
            perf is not None
            and perf.flops_per_step is None
            and state.total_flos
            and state.global_step
        ):
            perf.set_flops(
                state.total_flos / state.global_step,
                "hf: Trainer total_flos / global_step (6 x parameters x tokens)",
            )
        if any(key.startswith("eval_") for key in logs):
            return
        extra = perf_logs(session, self._last_logged)
        if not extra:
            return
        self._last_logged = perf.latest if perf is not None else None
        logs.update(extra)
        history = state.log_history
        if history and all(history[-1].get(k) == v for k, v in logs.items() if k not in extra):
            history[-1].update(extra)
