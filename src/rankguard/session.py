"""The in-loop API: one call to start, one cheap call per step.

``rankguard.init()`` builds the session from the environment the launcher set
(:mod:`rankguard.bootstrap`, from :class:`rankguard.rank.runenv.RunEnv`) and returns a
:class:`Session`; outside any launcher it returns a :class:`NullSession` whose methods
do nothing. Both satisfy :class:`rankguard.rank.ranksession.RankSession`. Under plain
torchrun it returns a local session: the in-rank parts (progress hook, performance
monitor and its files under ``rankguard_logs/``) work, and one log line says that
cross-rank monitoring needs ``rankguard run``. Sessions are plain objects, not hidden
globals: tests may create several in one process (ranks as threads, each session given
its ``training_thread``); ``init()`` only remembers the process's default one so that
the worker bootstrap and the user's script share it.
Components reach the session through its constructor and its methods
(:meth:`Session.add_heartbeat_block`), never by setting its attributes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rankguard.monitor.agree import ControlReader
from rankguard.monitor.config import HeartbeatConfig
from rankguard.preempt.handler import ignore_exit_signal
from rankguard.rank import ranksession, runenv
from rankguard.rank.identity import RankIdentity
from rankguard.rank.phases import PhaseWatcher
from rankguard.rank.publisher import HeartbeatPublisher
from rankguard.rank.timeline import CLOSING_PHASE, ProgressTracker
from rankguard.schema.blocks import BlockSource, PerfBlock, StragglerBlock, fields_source

if TYPE_CHECKING:
    import torch

    from rankguard.perf.autodetect import PerfDetector
    from rankguard.perf.reporter import PerfReporter
    from rankguard.preempt.rank import RankPreemption
    from rankguard.rank.elastic import BatchPlan
    from rankguard.rank.lifeline import Lifeline
    from rankguard.rank.ranksession import RankSession
    from rankguard.rerun.config import RerunStateMachineConfig
    from rankguard.rerun.machine import RerunStateMachine
    from rankguard.straggler.probe import ComputeProbe

__all__ = ["NullSession", "Session", "current", "install"]

logger = logging.getLogger(__name__)


class _Phase:
    __slots__ = ("_name", "_previous", "_tracker")

    def __init__(self, tracker: ProgressTracker, name: str) -> None:
        self._tracker = tracker
        self._name = name
        self._previous = tracker.phase

    def __enter__(self) -> None:
        self._previous = self._tracker.phase
        self._tracker.set_phase(self._name)

    def __exit__(self, *exc: object) -> None:
        self._tracker.set_phase(self._previous)


class _Checkpoint:
    __slots__ = ("_id", "_inner", "_progress", "_tracker")

    def __init__(self, tracker: ProgressTracker, checkpoint_id: str | None, progress: bool) -> None:
        self._tracker = tracker
        self._id = checkpoint_id
        self._progress = progress
        self._inner = False

    def __enter__(self) -> None:
        tracker = self._tracker
        # a wait inside the script's own checkpoint leaves that checkpoint as it is
        self._inner = not self._progress and tracker.checkpoint_active
        if not self._inner:
            tracker.checkpoint_start(self._id)

    def __exit__(self, *exc: object) -> None:
        if not self._inner:
            self._tracker.checkpoint_end(self._progress)


class _DataLoading:
    """``with session.data_loading():`` time spent waiting for data (perf share)."""

    __slots__ = ("_t0", "_tracker")

    def __init__(self, tracker: ProgressTracker) -> None:
        self._tracker = tracker
        self._t0 = 0

    def __enter__(self) -> None:
        self._t0 = self._tracker.now_ns()

    def __exit__(self, *exc: object) -> None:
        tracker = self._tracker
        tracker.data_ns += tracker.now_ns() - self._t0


class _Step:
    """Reusable ``with session.step():`` block: phase ``train``, step end on success."""

    __slots__ = ("_iteration", "_session")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._iteration: int | None = None

    def __call__(self, iteration: int | None = None) -> _Step:
        self._iteration = iteration
        return self

    def __enter__(self) -> None:
        session = self._session
        if not session._explicit:
            session._take_over_progress()
        tracker = session.tracker
        if tracker.phase != "train":
            tracker.set_phase("train")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:  # __enter__ made the session explicit: straight to the tracker
            self._session._tracker_step_end(self._iteration)


class Session:
    """A rank's monitoring session: progress tracker, heartbeat publisher (when heartbeat
    monitoring is on) and performance reporter (when given)."""

    enabled = True

    def __init__(
        self,
        identity: RankIdentity,
        run_dir: Path,
        config: HeartbeatConfig,
        *,
        tracker: ProgressTracker | None = None,
        publish: bool = True,
        perf: PerfReporter | None = None,
        blocks: Sequence[BlockSource] = (),
        probe: ComputeProbe | None = None,
        phases: PhaseWatcher | None = None,
        detector: PerfDetector | None = None,
        rerun_config: RerunStateMachineConfig | None = None,
        preemption: RankPreemption | None = None,
        dataloader_ignores_signal: bool = False,
        lifeline: Lifeline | None = None,
        env: runenv.RunEnv | None = None,
        training_thread: threading.Thread | None = None,
    ) -> None:
        """``phases``: recognises evaluation and saving from the training thread's stack
        (the one the perf reporter samples too); by default one built from
        ``config.phase_patterns`` when ``config.phase_detection`` is on.
        ``training_thread``: the thread that runs the training loop, whose stack the
        heartbeat samples (``main_frame``, the phase) and whose optimizer steps alone
        count as progress; None: the main thread, and every optimizer step in the
        process counts (one session per process). ``blocks``:
        more heartbeat block sources (see :meth:`add_heartbeat_block`). ``lifeline``:
        the heartbeat thread checks at every beat that the launcher is still there.
        ``env``: the run's environment (default: this process's, when asked)."""
        self.identity = identity
        self.detector = detector  # batch shape and FLOPs of an unmodified script
        self.rerun_config = rerun_config
        self.preemption = preemption
        self._dataloader_ignores_signal = dataloader_ignores_signal
        self._env = env
        self.training_thread = training_thread
        self.config = config
        self.tracker = tracker or ProgressTracker()
        self.perf = perf
        if phases is None and config.phase_detection:
            phases = PhaseWatcher(
                self.tracker, config.phase_patterns, training_thread=training_thread
            )
        self.phases = phases
        self._control: ControlReader | None = ControlReader(run_dir) if publish else None
        sources: list[BlockSource] = []
        if perf is not None:
            sources.append(fields_source(PerfBlock, perf.heartbeat_fields))
        sources += blocks
        if probe is not None:
            sources.append(fields_source(StragglerBlock, probe.heartbeat_fields))
        if preemption is not None:
            sources.append(preemption.heartbeat_block)
        self.publisher = (
            HeartbeatPublisher(
                identity,
                run_dir,
                self.tracker,
                config.publish_interval_s,
                blocks=sources,
                ticks=(self._poll_control,),
                max_file_bytes=config.max_file_bytes,
                phases=phases,
                lifeline=lifeline,
                training_thread=training_thread,
            )
            if publish
            else None
        )
        self._data = _DataLoading(self.tracker)
        self._hook: Any = None
        self._explicit = False  # has the script called step_end itself yet?
        self._step = _Step(self)
        self._tracker_step_end = self.tracker.step_end
        self._compute: ComputeProbe | _NullContext = _NULL_CONTEXT
        if probe is not None:  # straggler detection: measure each step's own compute
            self._tracker_step_end = probe.step_end
            self._compute = probe  # ``with probe:`` times one compute section
        self._stop_at: int | None = None
        # should_stop()'s fast path: True while there is nothing to look at (no stop
        # step, no signal). The first question turns the exit-signal handler on.
        self._quiet = False
        if preemption is not None:
            preemption.notify(self._note_signal)
        if self.publisher is not None:
            self.publisher.start()
        if perf is not None:
            perf.start()

    def add_heartbeat_block(self, source: BlockSource) -> None:
        """A heartbeat block in every record from now on (the rerun state machine's
        ``rerun``, the in-process restart's ``inprocess``): ``source`` runs on the
        heartbeat thread before each record and returns a block of
        :mod:`rankguard.schema.blocks` (None: none in that record). Without heartbeats
        (``publish=False``) nothing is published."""
        if self.publisher is not None:
            self.publisher.add_block(source)

    def publish_heartbeat(self, timeout_s: float = 2.0) -> bool:
        """A heartbeat record written now and on disk when this returns (False: none
        within ``timeout_s``, or no heartbeats): what must reach node 0 even if the
        process is killed next, an in-process re-entry."""
        return self.publisher is not None and self.publisher.publish(timeout_s)

    @property
    def current_phase(self) -> str | None:
        """The phase the tracker holds now."""
        return self.tracker.phase

    def mark_recovered(self) -> None:
        """Back from an in-process restart: progress counts afresh from now."""
        self.tracker.mark_recovered()

    def note_resumed(self, step: int) -> None:
        """A checkpoint of ``step`` was loaded (the iteration shown follows it)."""
        self.tracker.note_resumed(step)

    def note_saved(self, step: int, seq: int | None = None) -> None:
        """A save of ``step`` completed: committed, a next run can load it (rankguard's
        checkpoint manager and ``TorchFileSaver`` say it themselves; call it after your
        own saver's save and wait). ``seq``: :meth:`training_steps` when the save's state
        was taken (default: now). A preemption's "saved" needs it on every rank."""
        self.tracker.note_saved(step, seq)

    def training_steps(self) -> int:
        """Training steps this process issued (saves left out): an agreed stop step's
        numbering."""
        return self.tracker.training_steps()

    @property
    def restart_count(self) -> int:
        """How many times the launcher restarted the worker group before this process
        (0 in the first attempt): resume from the latest checkpoint when > 0."""
        return (self._env or runenv.current()).restart_count

    def batch_plan(self, global_batch: int, micro_batch: int) -> BatchPlan:
        """This rank's share of a step at the world size it runs with now (an elastic
        job that shrank or grew), by ``elastic.batch_rule`` (:mod:`rankguard.rank.elastic`):
        ``accumulation_steps`` micro-batches of ``micro_batch`` samples per step."""
        plan: BatchPlan = (self._env or runenv.current()).batch_plan(global_batch, micro_batch)
        return plan

    def renumbered(self, rank: int, world_size: int) -> None:
        """The ranks were renumbered in process (live recovery went on with fewer ranks:
        ``inprocess_restart.shrink_when_no_standby``): :meth:`batch_plan` follows the
        world the rank runs in now. The heartbeats keep the rank's first number."""
        if self._env is not None:
            self._env = dataclasses.replace(self._env, rank=rank, world_size=world_size, _cache={})

    # ---- hot path -------------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        """Mark the end of one training step (microseconds; no I/O, no sync).

        The first call takes progress over from the optimizer hook; from then on the
        instance's ``step_end`` is the tracker's own (one Python call per step)."""
        if not self._explicit:
            self._take_over_progress()
        self._tracker_step_end(iteration)

    def step(self, iteration: int | None = None) -> _Step:
        """``with session.step(i): ...``: phase train, progress on clean exit."""
        return self._step(iteration)

    def compute(self) -> ComputeProbe | _NullContext:
        """``with session.compute():`` around the rank's own compute (forward and
        backward up to the first collective): what straggler detection measures."""
        return self._compute

    def should_stop(self) -> bool:
        """True at the step every rank agreed to stop at (straggler ``stop_if_detected``,
        preemption): checkpoint this step and leave the loop. Ask it at every step
        boundary: without a stop step or a signal it is one attribute read."""
        if self._quiet:
            return False
        return self._check_stop()

    def _check_stop(self) -> bool:
        self._quiet = True  # before reading: a concurrent update sets it back
        pre = self.preemption
        if pre is not None:
            pre.handler.listening = True
            if pre.handler.received:
                self._quiet = False
                if not pre.reported and self.publisher is not None:
                    pre.reported = True
                    self.publisher.wake()  # node 0 learns this rank's step now
                if pre.after_signal(self._stop_at is not None) and self._control is not None:
                    self._poll_control()  # one stat, at most every 50 ms, only now
        stop_at = self._stop_at
        if stop_at is None:
            return False
        self._quiet = False
        tracker = self.tracker  # training steps: saves are progress, not steps
        steps = tracker.issued_seq - tracker.checkpoint_count
        if steps < stop_at:
            return False
        if tracker.stopped_at is None:  # its process_end says it left at the request
            tracker.stopped_at = steps
        return True

    def _note_signal(self, signum: int) -> None:
        self._quiet = False  # from the signal handler: a flag only

    @property
    def preempted(self) -> bool:
        """The exit signal came (to this rank or its launcher): the job is being
        preempted. :meth:`should_stop` says at which step to save and leave."""
        pre = self.preemption
        reason = self.stop_reason or ""
        return (pre is not None and pre.received) or reason.startswith("preempt")

    def exit_preempted(self) -> None:
        """Leave after the preemption save. The rank exits 0: a non-zero exit would
        make torch elastic terminate the peers still saving; the launcher, which knows
        the job was preempted, exits with the requeue code (``EXIT_PREEMPTED``)."""
        tracker = self.tracker
        if tracker.stopped_at is None:  # left at the request, not at the end of training
            tracker.stopped_at = tracker.training_steps()
        raise SystemExit(0)

    @property
    def worker_init_fn(self) -> Callable[[int], None] | None:
        """For ``DataLoader(worker_init_fn=...)``: with
        ``preemption.enable_exit_handler_for_data_loader``, workers ignore the exit
        signal (:func:`rankguard.preempt.ignore_exit_signal`); else None."""
        return ignore_exit_signal if self._dataloader_ignores_signal else None

    @property
    def stop_reason(self) -> str | None:
        return self._control.reason if self._control is not None else None

    def _poll_control(self) -> None:
        control = self._control
        assert control is not None
        control.poll()
        if control.stop_at_step is not None:
            self._stop_at = control.stop_at_step
            self._quiet = False

    # ---- rerun state machine --------------------------------------------------------

    def rerun(
        self, config: RerunStateMachineConfig | None = None, **kwargs: Any
    ) -> RerunStateMachine:
        """A :class:`~rankguard.rerun.RerunStateMachine` configured by the run's
        ``rerun_state_machine`` section (or ``config``); its outcomes ride in this
        rank's heartbeats and become findings. ``kwargs``: checkpoint, state_dir, group,
        generators (see the class)."""
        publisher = self.publisher
        if publisher is not None:  # a verdict reaches the file before a peer can exit
            kwargs.setdefault("publish", publisher.publish)
        machine = _rerun_machine(config or self.rerun_config, kwargs)
        self.add_heartbeat_block(machine.heartbeat_block)
        return machine

    # ---- phases and checkpoints -----------------------------------------------------

    def set_phase(self, name: str) -> None:
        """Set the phase (setup, train, eval, ...). Never advances progress."""
        self.tracker.set_phase(name)

    def phase(self, name: str) -> _Phase:
        """``with session.phase("eval"):`` restores the previous phase afterwards."""
        return _Phase(self.tracker, name)

    def checkpoint(self, checkpoint_id: str | None = None, *, progress: bool = True) -> _Checkpoint:
        """``with session.checkpoint("step_100"):`` the monitor applies
        checkpoint_timeout_s inside; the end counts as progress. ``progress=False``: a
        wait for a write already started (the end is no progress; inside another
        checkpoint it changes nothing)."""
        return _Checkpoint(self.tracker, checkpoint_id, progress)

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        self.tracker.checkpoint_start(checkpoint_id)

    def checkpoint_end(self) -> None:
        self.tracker.checkpoint_end()

    # ---- performance inputs ---------------------------------------------------------

    def data_loading(self) -> _DataLoading:
        """``with session.data_loading(): batch = next(it)``: counted as data time."""
        return self._data

    def set_batch(
        self,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        data_parallel_size: int | None = None,
        source: str = "user: set_batch",
    ) -> None:
        """Samples and tokens one optimizer step consumes on each data-parallel replica
        (all micro-batches); the global batch is that times ``data_parallel_size``
        (default: the world size, i.e. pure data parallelism). Call again if it changes.
        With ``perf.model`` configured, this also sets the analytic FLOPs. ``source``:
        where the figures came from (the perf summary's ``batch_source``)."""
        if self.perf is not None:
            self.perf.set_batch(
                samples=samples,
                tokens=tokens,
                data_parallel_size=data_parallel_size,
                source=source,
            )

    def set_flops_per_step(self, flops: float, source: str = "user") -> None:
        """Training FLOPs of one optimizer step for the global batch."""
        if self.perf is not None:
            self.perf.set_flops(flops, source)

    def measure_flops(
        self,
        model: torch.nn.Module,
        example_inputs: tuple[Any, ...],
        *,
        loss_fn: Callable[[Any], torch.Tensor] | None = None,
        data_parallel_size: int | None = None,
    ) -> float | None:
        """Count one forward+backward of ``model`` on this replica's step inputs with
        ``FlopCounterMode`` (once, at setup: it takes about a second) and use it times
        the data-parallel size as the step's FLOPs. Returns the global figure."""
        if self.perf is None:
            return None
        # here, not at the top: perf.measured imports torch, `import rankguard` must not
        from rankguard.perf.measured import measured_flops_per_step

        per_replica = measured_flops_per_step(model, example_inputs, loss_fn=loss_fn)
        dp = data_parallel_size or self.identity.world_size
        self.perf.set_flops(per_replica * dp, f"measured: FlopCounterMode x {dp} replicas")
        return per_replica * dp

    # ---- zero-code progress ---------------------------------------------------------

    def install_optimizer_hook(self) -> None:
        """Count optimizer steps as progress until the script calls :meth:`step_end`.

        Uses PyTorch's public global ``register_optimizer_step_post_hook``. With several
        optimizers, only the first one that steps (the lead) counts, so one iteration is
        one progress step. A session given its ``training_thread`` counts only the steps
        taken on that thread (another session's rank thread steps its own optimizers).
        """
        # here, not at the top: `import rankguard` (and so the light commands) stays torch-free
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self._hook is not None or self._explicit:
            return
        tracker_step_end = self._tracker_step_end
        step: Callable[[Any, Any, Any], None]
        if tracker_step_end == self.tracker.step_end:
            # the tracker's own hook: the step end itself, one call per optimizer step
            step = self.tracker.optimizer_step_hook
        else:  # the straggler probe wraps the step end
            leads = self.tracker.leads

            def step(optimizer: Any, args: Any, kwargs: Any) -> None:
                if leads(optimizer):
                    tracker_step_end(None)

        thread = self.training_thread
        if thread is not None:  # one of several sessions: only its own thread's steps
            inner = step
            current_thread = threading.current_thread

            def step(optimizer: Any, args: Any, kwargs: Any) -> None:
                if current_thread() is thread:
                    inner(optimizer, args, kwargs)

        self._hook = register_optimizer_step_post_hook(step)
        self.tracker.source = "optimizer_hook"

    def take_over_progress(self) -> None:
        """See :meth:`RankSession.take_over_progress` (idempotent)."""
        if not self._explicit:
            self._take_over_progress()

    def _take_over_progress(self) -> None:
        """The script reports its own steps: the optimizer hook stops counting, and
        ``step_end`` goes straight to the tracker from now on."""
        self._explicit = True
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        self.tracker.source = "api"
        self.step_end = self._tracker_step_end  # type: ignore[method-assign]

    # ---- end ------------------------------------------------------------------------

    def close(
        self, *, clean: bool = True, exit_code: int | None = None, error: str | None = None
    ) -> None:
        # The script is done: what follows (the perf monitor's last poll and summary, the
        # trackers' flush, which takes seconds for some) is no step the monitor waits for.
        tracker = self.tracker
        ended_in = tracker.effective_phase()[0]
        tracker.set_phase(CLOSING_PHASE)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.detector is not None:
            self.detector.remove()
        if self.perf is not None:
            try:
                self.perf.close()
            except Exception:
                logger.exception("rankguard: writing the performance summary failed")
        # the end record names the phase the script ended in (a crash in eval says eval)
        tracker.set_phase(ended_in)
        if self.publisher is not None:
            self.publisher.close(clean=clean, exit_code=exit_code, error=error)
        if self.preemption is not None:
            self.preemption.release()


class NullSession:
    """What ``init()`` returns outside ``rankguard run``: every call is a no-op."""

    enabled = False
    perf: PerfReporter | None = None
    current_phase: str | None = None

    @property
    def restart_count(self) -> int:
        return runenv.current().restart_count

    def batch_plan(self, global_batch: int, micro_batch: int) -> BatchPlan:
        """As :meth:`Session.batch_plan` (torchrun's world size, ``keep_global``)."""
        plan: BatchPlan = runenv.current().batch_plan(global_batch, micro_batch)
        return plan

    def step_end(self, iteration: int | None = None) -> None:
        pass

    def rerun(
        self, config: RerunStateMachineConfig | None = None, **kwargs: Any
    ) -> RerunStateMachine:
        """The rerun state machine without monitoring: its outcomes go to the log only."""
        if config is None:
            from rankguard.rerun.config import RerunStateMachineConfig as Config

            config = runenv.current().section("rerun_state_machine", Config)
        return _rerun_machine(config, kwargs)

    def step(self, iteration: int | None = None) -> _NullContext:
        return _NULL_CONTEXT

    def set_phase(self, name: str) -> None:
        pass

    def phase(self, name: str) -> _NullContext:
        return _NULL_CONTEXT

    def checkpoint(
        self, checkpoint_id: str | None = None, *, progress: bool = True
    ) -> _NullContext:
        return _NULL_CONTEXT

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        pass

    def checkpoint_end(self) -> None:
        pass

    def mark_recovered(self) -> None:
        pass

    def note_resumed(self, step: int) -> None:
        pass

    def note_saved(self, step: int, seq: int | None = None) -> None:
        pass

    def training_steps(self) -> int:
        return 0

    def add_heartbeat_block(self, source: BlockSource) -> None:
        pass

    def publish_heartbeat(self, timeout_s: float = 2.0) -> bool:
        return False

    def install_optimizer_hook(self) -> None:
        pass

    def take_over_progress(self) -> None:
        pass

    def data_loading(self) -> _NullContext:
        return _NULL_CONTEXT

    def compute(self) -> _NullContext:
        return _NULL_CONTEXT

    def should_stop(self) -> bool:
        return False

    preempted = False
    worker_init_fn = None

    def exit_preempted(self) -> None:
        from rankguard.schema.exits import EXIT_PREEMPTED

        raise SystemExit(EXIT_PREEMPTED)  # no launcher here to say it

    @property
    def stop_reason(self) -> str | None:
        return None

    def set_batch(
        self,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        data_parallel_size: int | None = None,
        source: str = "user: set_batch",
    ) -> None:
        pass

    def set_flops_per_step(self, flops: float, source: str = "user") -> None:
        pass

    def measure_flops(self, model: Any, example_inputs: Any, **kw: Any) -> float | None:
        return None

    def close(
        self, *, clean: bool = True, exit_code: int | None = None, error: str | None = None
    ) -> None:
        pass


def _rerun_machine(
    config: RerunStateMachineConfig | None, kwargs: dict[str, Any]
) -> RerunStateMachine:
    from rankguard.rerun.machine import RerunStateMachine  # imports torch

    return RerunStateMachine(config, **kwargs)


class _NullContext:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_CONTEXT = _NullContext()


def install(factory: Callable[[], Session | NullSession]) -> Session | NullSession:
    """The process's default session: built by ``factory`` the first time (the rank
    bootstrap passes its lifeline this way), the same one afterwards (the slot is
    :func:`rankguard.rank.ranksession.install`'s). ``rankguard.init()`` is
    :func:`rankguard.bootstrap.init`: building a session from the environment is the
    bootstrap's."""
    session = ranksession.install(factory)
    assert isinstance(session, Session | NullSession)
    return session


def current() -> Session | NullSession | None:
    """The session ``init()`` created, or None before it."""
    session = ranksession.current()
    return session if isinstance(session, Session | NullSession) else None


if TYPE_CHECKING:

    def _both_are_rank_sessions(s: Session, n: NullSession) -> tuple[RankSession, RankSession]:
        return s, n  # mypy checks that both satisfy the protocol
