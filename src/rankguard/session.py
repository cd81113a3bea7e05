"""The in-loop API: one call to start, one cheap call per step.

``rankguard.init()`` reads everything from the environment the launcher set and returns
a :class:`Session`; outside ``rankguard run`` it returns a :class:`NullSession` whose
methods do nothing (and warns once if the process was started by plain torchrun, where
the user probably expected monitoring). Sessions are plain objects, not hidden globals:
tests may create several in one process; ``init()`` only remembers the process's
default one so that the worker bootstrap and the user's script share it.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rankguard.agree import ControlReader
from rankguard.config import loads_config
from rankguard.ft.simulate import FaultSimulator
from rankguard.ft.stats import SectionStats
from rankguard.heartbeat.config import HeartbeatConfig
from rankguard.heartbeat.identity import ENV, RankIdentity
from rankguard.heartbeat.publisher import HeartbeatPublisher
from rankguard.perf.reporter import PerfReporter
from rankguard.schema.layout import perf_dir
from rankguard.straggler.probe import ComputeProbe
from rankguard.timeline import ProgressTracker

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

__all__ = ["NullSession", "Session", "current", "init"]

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
    __slots__ = ("_id", "_tracker")

    def __init__(self, tracker: ProgressTracker, checkpoint_id: str | None) -> None:
        self._tracker = tracker
        self._id = checkpoint_id

    def __enter__(self) -> None:
        self._tracker.checkpoint_start(self._id)

    def __exit__(self, *exc: object) -> None:
        self._tracker.checkpoint_end()


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
        extra: Callable[[], dict[str, Any]] | None = None,
        probe: ComputeProbe | None = None,
    ) -> None:
        self.identity = identity
        self.config = config
        self.tracker = tracker or ProgressTracker()
        self.perf = perf
        self._added: list[Callable[[], dict[str, Any] | None]] = []
        self.publisher = (
            HeartbeatPublisher(
                identity,
                run_dir,
                self.tracker,
                config.publish_interval_s,
                extra=_merge(
                    perf.heartbeat_fields if perf is not None else None,
                    extra,
                    probe.heartbeat_fields if probe is not None else None,
                    self._added_fields,
                ),
                max_file_bytes=config.max_file_bytes,
            )
            if publish
            else None
        )
        self._data = _DataLoading(self.tracker)
        self._hook: Any = None
        self._hook_lead: int | None = None
        self._explicit = False  # has the script called step_end itself yet?
        self._step = _Step(self)
        self._tracker_step_end = self.tracker.step_end
        self._compute: ComputeProbe | _NullContext = _NULL_CONTEXT
        if probe is not None:  # straggler detection: measure each step's own compute
            self._tracker_step_end = probe.step_end
            self._compute = probe  # ``with probe:`` times one compute section
        self._control = None
        self._stop_at: int | None = None
        if self.publisher is not None:
            self._control = ControlReader(run_dir)
            self.publisher.ticks.append(self._poll_control)
            self.publisher.start()
        if perf is not None:
            perf.start()

    def add_heartbeat_fields(self, source: Callable[[], dict[str, Any] | None]) -> None:
        """More fields for every heartbeat record from now on (the in-process restart's
        ``inprocess`` object); ``source`` runs on the heartbeat thread."""
        self._added.append(source)

    def _added_fields(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for source in list(self._added):
            out.update(source() or {})
        return out or None

    @property
    def restart_count(self) -> int:
        """How many times the launcher restarted the worker group before this process
        (0 in the first attempt): resume from the latest checkpoint when > 0."""
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    # ---- hot path -------------------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None:
        """Mark the end of one training step (microseconds; no I/O, no sync)."""
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
        later preemption): checkpoint this step and leave the loop."""
        stop_at = self._stop_at
        return stop_at is not None and self.tracker.issued_seq >= stop_at

    @property
    def stop_reason(self) -> str | None:
        return self._control.reason if self._control is not None else None

    def _poll_control(self) -> None:
        control = self._control
        assert control is not None
        control.poll()
        self._stop_at = control.stop_at_step

    # ---- phases and checkpoints -----------------------------------------------------

    def set_phase(self, name: str) -> None:
        """Set the phase (setup, train, eval, ...). Never advances progress."""
        self.tracker.set_phase(name)

    def phase(self, name: str) -> _Phase:
        """``with session.phase("eval"):`` restores the previous phase afterwards."""
        return _Phase(self.tracker, name)

    def checkpoint(self, checkpoint_id: str | None = None) -> _Checkpoint:
        """``with session.checkpoint("step_100"):`` the monitor applies
        checkpoint_timeout_s inside; the end counts as progress."""
        return _Checkpoint(self.tracker, checkpoint_id)

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
    ) -> None:
        """Samples and tokens one optimizer step consumes on each data-parallel replica
        (all micro-batches); the global batch is that times ``data_parallel_size``
        (default: the world size, i.e. pure data parallelism). Call again if it changes.
        With ``perf.model`` configured, this also sets the analytic FLOPs."""
        if self.perf is not None:
            self.perf.set_batch(
                samples=samples, tokens=tokens, data_parallel_size=data_parallel_size
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
        one progress step.
        """
        # here, not at the top: `import rankguard` (and so the light commands) stays torch-free
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self._hook is not None or self._explicit:
            return

        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            key = id(optimizer)
            if self._hook_lead is None:
                self._hook_lead = key
            if key == self._hook_lead:
                self._tracker_step_end(None)

        self.tracker.source = "optimizer_hook"
        self._hook = register_optimizer_step_post_hook(hook)

    def _take_over_progress(self) -> None:
        """The script reports its own steps: the optimizer hook stops counting."""
        self._explicit = True
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        self.tracker.source = "api"

    # ---- end ------------------------------------------------------------------------

    def close(
        self, *, clean: bool = True, exit_code: int | None = None, error: str | None = None
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.perf is not None:
            try:
                self.perf.close()
            except Exception:
                logger.exception("rankguard: writing the performance summary failed")
        if self.publisher is not None:
            self.publisher.close(clean=clean, exit_code=exit_code, error=error)


def _merge(
    *sources: Callable[[], dict[str, Any] | None] | None,
) -> Callable[[], dict[str, Any] | None] | None:
    """One ``extra`` callable for the publisher from several."""
    live = [s for s in sources if s is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def merged() -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for source in live:
            out.update(source() or {})
        return out or None

    return merged


class NullSession:
    """What ``init()`` returns outside ``rankguard run``: every call is a no-op."""

    enabled = False

    @property
    def restart_count(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def step_end(self, iteration: int | None = None) -> None:
        pass

    def step(self, iteration: int | None = None) -> _NullContext:
        return _NULL_CONTEXT

    def set_phase(self, name: str) -> None:
        pass

    def phase(self, name: str) -> _NullContext:
        return _NULL_CONTEXT

    def checkpoint(self, checkpoint_id: str | None = None) -> _NullContext:
        return _NULL_CONTEXT

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None:
        pass

    def checkpoint_end(self) -> None:
        pass

    def install_optimizer_hook(self) -> None:
        pass

    def data_loading(self) -> _NullContext:
        return _NULL_CONTEXT

    def compute(self) -> _NullContext:
        return _NULL_CONTEXT

    def should_stop(self) -> bool:
        return False

    @property
    def stop_reason(self) -> str | None:
        return None

    def set_batch(
        self,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        data_parallel_size: int | None = None,
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


class _NullContext:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_CONTEXT = _NullContext()
_default: Session | NullSession | None = None
_default_lock = threading.Lock()


def _session_from_env() -> Session | NullSession:
    run_dir = os.environ.get(ENV.RUN_DIR)
    if not run_dir or os.environ.get(ENV.LAUNCHER) != "1":
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            warnings.warn(
                "rankguard.init(): this process was not started by `rankguard run` "
                "(plain torchrun?), so heartbeats, progress, hang detection, stack dumps "
                "and restarts on hangs are OFF, whatever your rankguard config says. "
                "Launch with `rankguard run ...` to enable them.",
                RuntimeWarning,
                stacklevel=3,
            )
        return NullSession()
    cfg = loads_config(os.environ[ENV.CONFIG])
    if not (cfg.heartbeat.enabled or cfg.perf.enabled):
        return NullSession()
    identity = RankIdentity.from_env()
    tracker = ProgressTracker()
    perf = None
    if cfg.perf.enabled:
        log_dir = Path(os.environ.get(ENV.LOG_DIR) or cfg.log_dir)
        perf = PerfReporter(
            cfg.perf,
            tracker,
            rank=identity.rank,
            world_size=identity.world_size,
            run_id=identity.run_id,
            out_dir=perf_dir(log_dir, identity.run_id),
            job=os.environ.get(ENV.JOB),
            cuda_device=identity.gpu.ordinal if identity.gpu else None,
        )
    ft = cfg.fault_tolerance
    extra = None
    if ft.calc_ft_timeouts:
        extra = SectionStats(tracker).heartbeat_fields
    probe = None
    if cfg.straggler.enabled and cfg.heartbeat.enabled:
        probe = ComputeProbe(tracker.step_end, every=cfg.straggler.profiling_interval)
    session = Session(
        identity,
        Path(run_dir),
        cfg.heartbeat,
        tracker=tracker,
        publish=cfg.heartbeat.enabled,
        perf=perf,
        extra=extra,
        probe=probe,
    )
    if ft.simulate_fault and session.restart_count == 0:
        FaultSimulator(
            ft, rank=identity.rank, world_size=identity.world_size, run_id=identity.run_id
        ).start()
    return session


def init() -> Session | NullSession:
    """Start monitoring for this rank (idempotent); a no-op outside the launcher."""
    global _default
    with _default_lock:
        if _default is None:
            _default = _session_from_env()
        return _default


def current() -> Session | NullSession | None:
    """The session ``init()`` created, or None before it."""
    return _default
