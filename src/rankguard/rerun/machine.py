"""The rerun state machine: re-run an iteration whose result failed a check.

``validate_results``: when a check fails on any rank, every rank re-runs the same
iteration in place, with the same batches (:class:`~.data.RerunDataIterator`) and the
same random state (:mod:`.rng`), before the optimizer steps:

- a different result: a transient fault. The rank says so (finding
  ``rerun_transient_fault``) and training goes on with the re-run's result;
- the same result: the rank saves a checkpoint (the state before this iteration) and
  its rerun state (batches, random state, results) and the job exits 16, so it is
  resumed, on other hardware where the scheduler allows, and re-runs the iteration:
  - a different result there: the first hardware was faulty. Exit 17, naming the
    rank, the host and the GPU of the first run (``rerun_validation_failed``);
  - the same result: a real data or model problem (``rerun_reproducible_fault``):
    stop, or skip the batch (``on_reproducible``).

``report_determinism_stats``: every ``determinism_stats_interval`` iterations, re-run in
place and keep the largest relative difference per check (log, heartbeat, status).

Agreement: the decision after each attempt is an all-reduce (MAX) of a 3-element flag
tensor on the training process group, so every rank re-runs, exits or goes on together.
That is one small collective per iteration plus one host read of it; on GPU the read
waits for the step's work like the loop's own ``loss.item()`` does (checks themselves
run on the device). ``disabled`` does none of it: one attribute test per call.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from rankguard.rerun.agreement import Agreement
from rankguard.rerun.config import RerunStateMachineConfig
from rankguard.rerun.data import RerunDataIterator
from rankguard.rerun.inject import ErrorInjector
from rankguard.rerun.results import gpu_name, not_finite, relative_diff, scalar, truth
from rankguard.rerun.rng import RngSnapshot, restore_rng, snapshot_rng
from rankguard.rerun.state import RerunState, check_transition
from rankguard.rerun.statefile import load_state, remove_state, save_state, state_path
from rankguard.schema.exits import EXIT_RERUN_RESUME, EXIT_RERUN_VALIDATION_FAILED
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.rerun import MAX_EVENTS, RerunBlock, RerunEvent, RerunOutcome

__all__ = [
    "EXIT_RESUME",
    "EXIT_VALIDATION_FAILED",
    "Checkpointer",
    "ReproducibleFaultError",
    "RerunStateMachine",
]

logger = logging.getLogger(__name__)

# Megatron's codes, defined with every other exit code in rankguard.schema.exits.
EXIT_RESUME = EXIT_RERUN_RESUME
EXIT_VALIDATION_FAILED = EXIT_RERUN_VALIDATION_FAILED

_NAN_MESSAGE = "loss is NaN or Inf"
_ATTEMPTS = (RerunState.INITIAL_RUN, RerunState.RERUN_IN_PLACE, RerunState.RERUN_FROM_CHECKPOINT)
_SPIKY_MESSAGE = "loss is spiky"


@runtime_checkable
class Checkpointer(Protocol):
    """What the state machine needs from a checkpoint manager (rankguard's
    ``CheckpointManager`` fits): save the state after ``step`` and wait for it."""

    def save(self, step: int) -> Any: ...

    def wait(self) -> Any: ...


class ReproducibleFaultError(RuntimeError):
    """A failed fatal check gave the same result after the job was resumed: the data or
    the model is at fault, not the hardware (``on_reproducible: stop``)."""


class _Check:
    """One ``validate_result`` call site in one iteration: both attempts' values."""

    __slots__ = ("fatal", "initial", "rejected", "rerun", "tolerance")

    def __init__(self, value: torch.Tensor, rejected: Any, fatal: bool, tolerance: float) -> None:
        self.initial = value
        self.rejected = rejected  # bool or a 0-d bool tensor (not read until the decision)
        self.fatal = fatal
        self.tolerance = tolerance
        self.rerun: torch.Tensor | None = None


class RerunStateMachine:
    """One rank's rerun state machine (one per training loop; not a global).

    ``group``: the training process group the decisions are all-reduced on (default:
    the world when torch.distributed is initialised; alone otherwise). ``checkpoint``: a
    :class:`Checkpointer` or a callable ``save(step)``, called on every rank with the
    last completed iteration before exit 16. ``state_dir``: where each rank keeps its
    rerun state for the resumed job (the checkpoint directory is a good place).
    ``generators``: torch generators the iteration draws from, besides the global ones.
    ``host_rngs``: snapshot Python's ``random`` and NumPy's global generator too (tens of
    microseconds a step; off when the loop draws from neither).
    ``publish``: writes this rank's heartbeat now (the session's); called with a
    verdict's events recorded, before the barrier after which a peer may exit (and its
    launcher kill this rank before the next heartbeat).
    ``agreement``: ``all_reduce`` (a 3-int MAX all-reduce per iteration) or
    ``grad_norm``: piggy-backed on the loop's gradient all-reduce. A failed check makes
    :meth:`validate_loss` return a NaN loss, whose backward spreads NaN to every rank's
    averaged gradients; the loop passes its clipped total gradient norm to
    :meth:`agree_on` and a non-finite norm is the agreed "re-run" (no collective of
    ours; the one host read is the norm's, which the loop reads for clipping anyway).
    """

    def __init__(
        self,
        config: RerunStateMachineConfig | None = None,
        *,
        group: Any = None,
        checkpoint: Checkpointer | Callable[[int], Any] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        generators: Sequence[torch.Generator] = (),
        host_rngs: bool = True,
        agreement: str = "all_reduce",
        exit: Callable[[int], Any] = sys.exit,
        publish: Callable[[], object] | None = None,
    ) -> None:
        self.config = config or RerunStateMachineConfig()
        self._publish = publish
        self.mode = self.config.rerun_mode
        self._disabled = self.mode == "disabled"
        self._group = group
        self._checkpoint = checkpoint
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self._generators = tuple(generators)
        self._exit = exit
        self._host_rngs = host_rngs
        if agreement not in ("all_reduce", "grad_norm"):
            raise ValueError(f"agreement: all_reduce or grad_norm, got {agreement!r}")
        self._piggyback = agreement == "grad_norm"
        self._agreed: torch.Tensor | float | None = None  # agree_on()'s value this attempt
        self._poison: Any = False  # a local check failed this attempt (device bool)
        self.state = RerunState.IDLE
        self.current_iteration = 0
        self.accepted = True  # False: skip this iteration's optimizer step
        self.reruns = 0
        self.events: deque[RerunEvent] = deque(maxlen=MAX_EVENTS)
        self.stats: dict[str, float] = {}
        self._event_seq = 0
        self._checks: dict[str, _Check] = {}
        self._calls: dict[str, int] = {}
        self._rng: RngSnapshot | None = None
        self._iterators: list[RerunDataIterator] = []
        self._pending: dict[str, Any] | None = None
        self._pending_checked = False
        self._max_loss: torch.Tensor | None = None
        self._losses_seen = 0
        self._agreement = Agreement(group)
        self.rank = self._agreement.rank
        self.hostname = socket.gethostname()
        self.gpu = gpu_name()
        self.injector = ErrorInjector(
            self.config.error_injection_rate,
            self.config.error_injection_type,
            seed=self.config.error_injection_seed,
            rank=self.rank,
        )
        if self.config.enabled and self.mode == "validate_results":
            if checkpoint is None or state_dir is None:
                logger.warning(
                    "rankguard rerun [rank %d]: validate_results without a checkpoint and a "
                    "state_dir: a result that reproduces in place cannot be re-run after a "
                    "resume; the job will exit 16 without saving",
                    self.rank,
                )
            self._pending = self._load_pending()

    # ---- the loop's API -------------------------------------------------------------

    def replay(self, iterable: Any) -> RerunDataIterator:
        """Wrap the loop's data iterator so an iteration can be replayed."""
        return iterable if isinstance(iterable, RerunDataIterator) else RerunDataIterator(iterable)

    def iteration(
        self, iteration: int, data_iterator: RerunDataIterator | Sequence[Any] | None = None
    ) -> Iterator[RerunStateMachine]:
        """``for _ in rerun.iteration(step, batches): <forward, validate, backward>``: the
        body runs once, or twice when it must be re-run; then ``if rerun.accepted:
        optimizer.step()``. Zero the gradients at the top of the body."""
        finished = False
        try:
            while self.should_run_forward_backward(data_iterator, iteration):
                yield self
            finished = True
        finally:
            if not finished and self.state in _ATTEMPTS:
                # the body raised or broke out: this iteration is abandoned undecided
                self._go(RerunState.IDLE)

    def should_run_forward_backward(
        self,
        data_iterator: RerunDataIterator | Sequence[Any] | None = None,
        iteration: int | None = None,
    ) -> bool:
        """Megatron's driver: ``while rerun.should_run_forward_backward(it): ...``. True:
        run the forward and backward (again); False: the iteration is decided."""
        state = self.state
        if self._disabled:
            if state is RerunState.IDLE:
                self.state = RerunState.INITIAL_RUN
                self.current_iteration = (
                    self.current_iteration + 1 if iteration is None else iteration
                )
                return True
            self.state = RerunState.IDLE
            return False
        if state is RerunState.IDLE:
            return self._start(_iterators(data_iterator), iteration)
        if state is RerunState.INITIAL_RUN:
            return self._after_initial()
        if state is RerunState.RERUN_IN_PLACE:
            return self._after_rerun_in_place()
        if state is RerunState.RERUN_FROM_CHECKPOINT:
            return self._after_rerun_from_checkpoint()
        raise RuntimeError(f"rerun state machine: called in state {state.value}")

    def validate_result(
        self,
        result: Any,
        rejection_fn: Callable[[Any], Any],
        message: str = "result rejected",
        tolerance: float = 0.0,
        fatal: bool = True,
    ) -> None:
        """Check ``result`` (a tensor or a number) with ``rejection_fn`` (True: bad).
        Nothing is read back from the device here; the decision comes at the end of the
        attempt. ``tolerance``: the largest relative difference still "the same result"."""
        if self._disabled:
            return
        state = self.state
        n = self._calls.get(message, 0)
        self._calls[message] = n + 1
        key = message if n == 0 else f"{message} #{n + 1}"
        value = result.detach() if isinstance(result, torch.Tensor) else torch.tensor(result)
        if state is RerunState.INITIAL_RUN:
            rejected: Any = False
            if self.mode == "validate_results":
                rejected = rejection_fn(value)
                if self.injector.maybe_inject():
                    logger.warning(
                        "rankguard rerun [rank %d]: injecting a %s at iteration %d (%s)",
                        self.rank,
                        self.injector.injected,
                        self.current_iteration,
                        key,
                    )
                    rejected = True
                if self._piggyback:
                    self._poison = rejected | self._poison
            self._checks[key] = _Check(value, rejected, fatal, tolerance)
        elif state is RerunState.RERUN_IN_PLACE:
            check = self._checks.get(key)
            if check is not None:
                check.rerun = value
        elif state is RerunState.RERUN_FROM_CHECKPOINT:
            # compared with the first run's saved result at the end of the attempt
            check = self._checks[key] = _Check(value, rejection_fn(value), fatal, tolerance)
            check.rerun = value
        else:
            raise RuntimeError(
                f"rerun: validate_result() outside an iteration (state {state.value}); call "
                "it between should_run_forward_backward() calls"
            )

    def validate_loss(self, loss: Any) -> Any:
        """The configured loss checks: NaN/Inf (fatal) and spiky loss (not fatal).
        Returns the loss to back-propagate: ``loss`` itself, or with
        ``agreement="grad_norm"`` a NaN loss when a check failed on this rank (no
        device synchronisation either way)."""
        if self._disabled:
            return loss
        cfg = self.config
        if cfg.check_for_nan_in_loss:
            self.validate_result(loss, not_finite, _NAN_MESSAGE, fatal=True)
        if cfg.check_for_spiky_loss:
            self.validate_result(loss, self._is_spiky, _SPIKY_MESSAGE, fatal=False)
        if self._piggyback and isinstance(self._poison, torch.Tensor):
            return loss + torch.where(self._poison, math.nan, 0.0).to(loss.dtype)
        if self._piggyback and self._poison is True:
            return loss * math.nan
        return loss

    def agree_on(self, reduced: torch.Tensor | float) -> None:
        """``agreement="grad_norm"``: the value every rank shares after the loop's own
        collective (the total gradient norm ``clip_grad_norm_`` returns under DDP); not
        finite: some rank failed a check (or its gradients overflowed). A float the loop
        already read (for logging) costs no device synchronisation at all."""
        self._agreed = reduced

    @property
    def rerunning(self) -> bool:
        """Is the current attempt a re-run (in place or after a resume)?"""
        return self.state in (RerunState.RERUN_IN_PLACE, RerunState.RERUN_FROM_CHECKPOINT)

    # ---- what the rank publishes ------------------------------------------------------

    def block(self) -> RerunBlock:
        return RerunBlock(
            mode=self.mode, reruns=self.reruns, events=tuple(self.events), stats=dict(self.stats)
        )

    def heartbeat_block(self) -> RerunBlock | None:
        """The ``rerun`` block of this rank's heartbeat records (the publisher's thread);
        None when the machine is disabled."""
        if self._disabled:
            return None
        return self.block()

    # ---- transitions ------------------------------------------------------------------

    def _go(self, new: RerunState) -> None:
        self.state = check_transition(self.state, new)

    def _start(self, iterators: list[RerunDataIterator], iteration: int | None) -> bool:
        self.current_iteration = self.current_iteration + 1 if iteration is None else iteration
        self.accepted = True
        self._checks = {}
        self._calls = {}
        self._iterators = iterators
        self._agreed = None
        self._poison = False
        pending = self._agree_pending()
        if pending is not None and pending["iteration"] == self.current_iteration:
            self._go(RerunState.RERUN_FROM_CHECKPOINT)
            self.reruns += 1
            restore_rng(pending["rng"], self._generators)
            batches = pending["batches"]
            if len(batches) != len(iterators):
                raise ValueError(
                    f"rerun: the saved iteration had {len(batches)} data iterator(s), "
                    f"the loop passes {len(iterators)}"
                )
            for it, saved in zip(iterators, batches, strict=True):
                it.load_batches(saved)
            self.injector.injected = pending.get("injected")
            logger.warning(
                "rankguard rerun [rank %d]: re-running iteration %d after the resume",
                self.rank,
                self.current_iteration,
            )
            return True
        self._rng = snapshot_rng(self._generators, host=self._host_rngs)
        for it in iterators:
            it.advance()
        self.injector.injected = None
        self._go(RerunState.INITIAL_RUN)
        return True

    def _rewind(self) -> None:
        assert self._rng is not None
        restore_rng(self._rng, self._generators)
        for it in self._iterators:
            it.rewind()
        self._calls = {}
        self._poison = False  # the re-run's loss is back-propagated as it is
        self._agreed = None
        self.reruns += 1

    def _after_initial(self) -> bool:
        if self.mode == "report_determinism_stats":
            if self.current_iteration % self.config.determinism_stats_interval == 0:
                self._go(RerunState.RERUN_IN_PLACE)
                self._rewind()
                return True
            self._accept()
            return False
        if self._piggyback and self._agreed is not None:
            # the loop's own collective carried it: one host read, the loop's own
            agreed = self._agreed
            if isinstance(agreed, torch.Tensor):
                any_failed = not bool(torch.isfinite(agreed).all())
            else:
                any_failed = not math.isfinite(agreed)
        else:
            any_failed = self._agreement.any_true([c.rejected for c in self._checks.values()])
        self._agreed = None
        if not any_failed:
            self._accept()
            return False
        if any(truth(c.rejected) for c in self._checks.values()):
            names = [k for k, c in self._checks.items() if truth(c.rejected)]
            logger.warning(
                "rankguard rerun [rank %d]: iteration %d failed %s: re-running it in place",
                self.rank,
                self.current_iteration,
                ", ".join(names),
            )
        self._go(RerunState.RERUN_IN_PLACE)
        self._rewind()
        return True

    def _after_rerun_in_place(self) -> bool:
        if self.mode == "report_determinism_stats":
            for key, check in self._checks.items():
                if check.rerun is not None:
                    diff = relative_diff(check.initial, check.rerun)
                    self.stats[key] = max(self.stats.get(key, 0.0), diff)
            logger.info(
                "rankguard rerun [rank %d]: determinism at iteration %d: %s",
                self.rank,
                self.current_iteration,
                ", ".join(f"{k} {v:.3g}" for k, v in self.stats.items()) or "no checks",
            )
            self._accept()
            return False
        differed: list[tuple[str, _Check, float]] = []
        same_fatal: list[tuple[str, _Check, float]] = []
        same_other = False
        for key, check in self._checks.items():
            if not truth(check.rejected):
                continue
            diff = self.injector.in_place(relative_diff(check.initial, check.rerun))
            if diff > check.tolerance:
                differed.append((key, check, diff))
            elif check.fatal:
                same_fatal.append((key, check, diff))
            else:
                same_other = True
        any_differed, any_same_fatal = self._agreement.max([bool(differed), bool(same_fatal)])
        for key, check, _ in differed:
            self._event(
                RerunOutcome.TRANSIENT,
                key,
                check,
                f"rank {self.rank} on {self.hostname} ({self.gpu}): iteration "
                f"{self.current_iteration} failed '{key}', the re-run in place gave a "
                "different result: transient fault",
                action="exit_16" if any_same_fatal else "continue",
            )
        if any_same_fatal:
            saves = (
                "checkpoint and exit 16 to re-run it after a resume"
                if self._checkpoint is not None and self._state_dir is not None
                else "exit 16 WITHOUT a checkpoint (the rerun state machine was given no "
                "checkpoint and state_dir): a resumed job cannot re-run it"
            )
            for key, check, _ in same_fatal:
                self._event(
                    RerunOutcome.PERSISTENT,
                    key,
                    check,
                    f"rank {self.rank} on {self.hostname} ({self.gpu}): iteration "
                    f"{self.current_iteration} failed '{key}' twice with the same result: " + saves,
                    action="exit_16",
                )
            self._go(RerunState.WILL_RERUN_FROM_CHECKPOINT)
            self._save_and_exit()
            return False
        if same_other:
            logger.warning(
                "rankguard rerun [rank %d]: iteration %d: a non-fatal check failed again with "
                "the same result: going on",
                self.rank,
                self.current_iteration,
            )
        del any_differed
        self._accept()
        return False

    def _after_rerun_from_checkpoint(self) -> bool:
        pending = self._pending
        assert pending is not None
        first = pending["hardware"]
        same_hw = first == {"hostname": self.hostname, "gpu": self.gpu}
        differed: list[tuple[str, _Check]] = []
        same: list[tuple[str, _Check]] = []
        for key, check in self._checks.items():
            saved = pending["results"].get(key)
            if saved is None:
                if truth(check.rejected):  # a new failure: it reproduces a fault too
                    same.append((key, check))
                continue
            check.initial = saved
            diff = self.injector.after_resume(relative_diff(check.initial, check.rerun))
            (differed if diff > check.tolerance else same).append((key, check))
        any_differed, any_same = self._agreement.max([bool(differed), bool(same)])
        self._pending = None
        self._remove_state()
        if any_differed:
            culprits = self._gather_culprits(bool(differed), first)
            for key, check in differed:
                self._event(
                    RerunOutcome.VALIDATION_FAILED,
                    key,
                    check,
                    f"rank {self.rank}: iteration {self.current_iteration} ('{key}') gives a "
                    "different result after the resume: the first run's hardware was faulty: host "
                    f"{first['hostname']}, GPU {first['gpu']} (exit 17)",
                    faulty=first,
                    same_hardware=same_hw,
                    action="exit_17",
                )
            self._write_verdict(culprits)
            self._go(RerunState.STOPPED)
            self._leave(EXIT_VALIDATION_FAILED)
            return False
        action = "skip" if self.config.on_reproducible == "skip" else "stop"
        for key, check in same:
            note = (
                " (resumed on the same host and GPU: a faulty GPU is not ruled out)"
                if same_hw
                else ""
            )
            self._event(
                RerunOutcome.REPRODUCIBLE,
                key,
                check,
                f"rank {self.rank}: iteration {self.current_iteration} fails '{key}' with the same "
                f"result after the resume: a data or model problem{note}; action: {action}",
                same_hardware=same_hw,
                action=action,
            )
        if any_same and action == "stop":
            self._go(RerunState.STOPPED)
            self._published_barrier()
            raise ReproducibleFaultError(
                f"rerun: iteration {self.current_iteration} reproduces its failed check after the "
                "resume: a data or model problem (on_reproducible=stop)"
            )
        self.accepted = not any_same
        if any_same:
            logger.warning(
                "rankguard rerun [rank %d]: skipping the batch of iteration %d",
                self.rank,
                self.current_iteration,
            )
        self._go(RerunState.IDLE)
        return False

    def _accept(self) -> None:
        """The iteration's result stands: it feeds the spiky-loss maximum."""
        check = self._checks.get(_SPIKY_MESSAGE) if self.config.check_for_spiky_loss else None
        if check is not None:
            value = check.rerun if check.rerun is not None else check.initial
            loss = value.abs().float()
            self._max_loss = loss if self._max_loss is None else torch.fmax(self._max_loss, loss)
            self._losses_seen += 1
        self._go(RerunState.IDLE)

    # ---- checks -------------------------------------------------------------------------

    def _is_spiky(self, loss: torch.Tensor) -> Any:
        if self._max_loss is None or self._losses_seen < self.config.spiky_loss_warmup:
            return False  # warm-up: the largest loss so far means nothing yet
        return loss.abs() >= self.config.spiky_loss_factor * self._max_loss.to(loss.device)

    # ---- agreement ----------------------------------------------------------------------

    def _agree_pending(self) -> dict[str, Any] | None:
        """Once, at the first iteration: every rank has the same pending re-run (or none)."""
        if self._pending_checked:
            return self._pending
        self._pending_checked = True
        if self.mode != "validate_results":
            return None
        lo, hi = self._agreement.same_int(
            -1 if self._pending is None else int(self._pending["iteration"])
        )
        if lo != hi:
            raise RuntimeError(
                f"rerun: the ranks' saved rerun states disagree (iterations {lo} to {hi}; "
                f"-1: none) in {self._state_dir}: remove them or restore all of them"
            )
        if self._pending is not None and self._pending["iteration"] < self.current_iteration:
            logger.error(
                "rankguard rerun [rank %d]: the saved re-run of iteration %d was never reached "
                "(resumed at %d): dropped",
                self.rank,
                self._pending["iteration"],
                self.current_iteration,
            )
            self._pending = None
            self._remove_state()
        return self._pending

    def _gather_culprits(self, mine: bool, first: dict[str, Any]) -> list[dict[str, Any]]:
        me = {"rank": self.rank, **first} if mine else None
        return [c for c in self._agreement.gather(me) if c]

    # ---- exit 16 and the resumed job ---------------------------------------------------------

    def _state_path(self) -> Path | None:
        return state_path(self._state_dir, self.rank)

    def _save_and_exit(self) -> None:
        path = self._state_path()
        if path is not None:
            assert self._rng is not None
            state = {
                "iteration": self.current_iteration,
                "rng": self._rng,
                "batches": [it.batches for it in self._iterators],
                "results": {
                    k: c.initial.cpu() for k, c in self._checks.items() if truth(c.rejected)
                },
                "hardware": {"hostname": self.hostname, "gpu": self.gpu},
                "injected": self.injector.injected,
            }
            save_state(path, state)
        checkpoint = self._checkpoint
        if checkpoint is not None:
            if isinstance(checkpoint, Checkpointer):
                checkpoint.save(self.current_iteration - 1)
                checkpoint.wait()
            else:
                checkpoint(self.current_iteration - 1)
        self._leave(EXIT_RESUME)

    def _leave(self, code: int) -> None:
        """Every rank has saved (a peer's exit must not kill a rank still writing)."""
        self._published_barrier()
        logger.error("rankguard rerun [rank %d]: exit %d", self.rank, code)
        self._exit(code)

    def _published_barrier(self) -> None:
        """The barrier before the ranks leave, once this rank's verdict is in its
        heartbeat file: the first rank out ends the worker group, and a peer killed with
        its events unpublished would take them along (no finding for them)."""
        if self._publish is not None:
            self._publish()
        self._agreement.barrier()

    def _load_pending(self) -> dict[str, Any] | None:
        state = load_state(self._state_path())
        if state is None:
            return None
        logger.warning(
            "rankguard rerun [rank %d]: will re-run iteration %d (saved by %s)",
            self.rank,
            state["iteration"],
            state["hardware"]["hostname"],
        )
        return state

    def _remove_state(self) -> None:
        remove_state(self._state_path())

    def _write_verdict(self, culprits: list[dict[str, Any]]) -> None:
        """Rank 0 names the faulty hosts for the launcher and the scheduler wrapper; a
        faulty rank still on its first run's hardware tells its own node's launcher."""
        from rankguard.rerun.verdict import write_faulty_rank, write_verdict

        here: JsonObject = {"hostname": self.hostname, "gpu": self.gpu}
        for c in culprits:
            if c.get("rank") == self.rank and {k: c.get(k) for k in here} == here:
                write_faulty_rank(self.rank, here)
        if self.rank != 0:
            return

        write_verdict(self.current_iteration, culprits)

    # ---- events ---------------------------------------------------------------------------

    def _event(
        self,
        outcome: RerunOutcome,
        key: str,
        check: _Check,
        message: str,
        *,
        faulty: dict[str, Any] | None = None,
        same_hardware: bool | None = None,
        action: str | None = None,
    ) -> None:
        self._event_seq += 1
        event = RerunEvent(
            seq=self._event_seq,
            outcome=outcome,
            iteration=self.current_iteration,
            check=key,
            message=message,
            initial=scalar(check.initial),
            rerun=scalar(check.rerun),
            faulty_hostname=faulty["hostname"] if faulty else None,
            faulty_gpu=faulty["gpu"] if faulty else None,
            same_hardware=same_hardware,
            action=action,
        )
        self.events.append(event)
        log = logger.warning if outcome is RerunOutcome.TRANSIENT else logger.error
        log("rankguard rerun [rank %d]: %s", self.rank, message)


def _iterators(data: Any) -> list[RerunDataIterator]:
    if data is None:
        return []
    items = data if isinstance(data, (list, tuple)) else [data]
    for it in items:
        if not isinstance(it, RerunDataIterator):
            raise TypeError(
                "rerun: wrap the data iterator once with rerun.replay(iterator) so an "
                f"iteration can be replayed (got {type(it).__name__})"
            )
    return list(items)
