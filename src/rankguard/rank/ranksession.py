"""``RankSession``: what a rank's session offers, whichever session it is.

``rankguard.init()`` returns a :class:`~rankguard.session.Session` (under ``rankguard
run``, or a local one under plain torchrun) or a :class:`~rankguard.session.NullSession`
(elsewhere: every call a no-op). Both satisfy this protocol, checked by mypy (an
assignment in ``tests/unit/rank/test_ranksession.py`` and in :mod:`rankguard.session`) and at
run time (``isinstance``: it is ``runtime_checkable``), so the parts that take a session
(the in-process restart, the checkpoint manager, the framework callbacks) type it as a
``RankSession`` and call it without probing its attributes.

Torch-free: the types it names are imported for the type checker only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rankguard.perf.reporter import PerfReporter
    from rankguard.rerun.config import RerunStateMachineConfig
    from rankguard.rerun.machine import RerunStateMachine
    from rankguard.schema.blocks import BlockSource

__all__ = ["RankSession", "current", "install"]


@runtime_checkable
class RankSession(Protocol):
    """The in-loop API of one rank (see :class:`rankguard.session.Session` for each)."""

    @property
    def enabled(self) -> bool:
        """False for the no-op session."""
        ...

    @property
    def restart_count(self) -> int:
        """Process restarts of the worker group before this process (0 at first)."""
        ...

    @property
    def perf(self) -> PerfReporter | None:
        """The performance monitor (None when off)."""
        ...

    @property
    def current_phase(self) -> str | None:
        """The phase the tracker holds now (None without one)."""
        ...

    @property
    def preempted(self) -> bool: ...

    @property
    def worker_init_fn(self) -> Callable[[int], None] | None: ...

    @property
    def stop_reason(self) -> str | None: ...

    # ---- hot path and steps ---------------------------------------------------------

    def step_end(self, iteration: int | None = None) -> None: ...

    def step(self, iteration: int | None = None) -> AbstractContextManager[None]: ...

    def compute(self) -> AbstractContextManager[None]: ...

    def should_stop(self) -> bool: ...

    def exit_preempted(self) -> None: ...

    def install_optimizer_hook(self) -> None: ...

    def take_over_progress(self) -> None:
        """The caller reports every step with ``step_end`` from now on (a framework's
        callback, before its first optimizer step): the optimizer hook stops counting,
        so no step is counted twice and one numbering holds everywhere."""
        ...

    # ---- phases and checkpoints -----------------------------------------------------

    def set_phase(self, name: str) -> None: ...

    def phase(self, name: str) -> AbstractContextManager[None]: ...

    def checkpoint(
        self, checkpoint_id: str | None = None, *, progress: bool = True
    ) -> AbstractContextManager[None]: ...

    def checkpoint_start(self, checkpoint_id: str | None = None) -> None: ...

    def checkpoint_end(self) -> None: ...

    def mark_recovered(self) -> None:
        """The rank is back from an in-process restart (progress counts afresh)."""
        ...

    def note_resumed(self, step: int) -> None:
        """A checkpoint of ``step`` was loaded: the iteration shown is ``step`` plus the
        steps since, for a script that does not number its steps itself."""
        ...

    def note_saved(self, step: int, seq: int | None = None) -> None:
        """A save of ``step`` completed (committed: a next run can load it); ``seq``:
        :meth:`training_steps` when its state was taken (default: now)."""
        ...

    def training_steps(self) -> int:
        """Training steps this process issued (saves left out)."""
        ...

    # ---- components -----------------------------------------------------------------

    def add_heartbeat_block(self, source: BlockSource) -> None:
        """A heartbeat block in every record from now on (``source`` runs on the
        heartbeat thread and returns the block, or None)."""
        ...

    def publish_heartbeat(self, timeout_s: float = 2.0) -> bool:
        """A heartbeat record written now, its blocks as they are now, and on disk when
        this returns: for what must reach node 0 even if the process is killed next. False
        when none was written within ``timeout_s`` (or without heartbeats)."""
        ...

    def rerun(
        self, config: RerunStateMachineConfig | None = None, **kwargs: Any
    ) -> RerunStateMachine: ...

    # ---- performance inputs ---------------------------------------------------------

    def data_loading(self) -> AbstractContextManager[None]: ...

    def set_batch(
        self,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        data_parallel_size: int | None = None,
        source: str = "user: set_batch",
    ) -> None: ...

    def set_flops_per_step(self, flops: float, source: str = "user") -> None: ...

    def measure_flops(
        self,
        model: Any,
        example_inputs: tuple[Any, ...],
        *,
        loss_fn: Callable[[Any], Any] | None = None,
        data_parallel_size: int | None = None,
    ) -> float | None: ...

    # ---- end ------------------------------------------------------------------------

    def close(
        self, *, clean: bool = True, exit_code: int | None = None, error: str | None = None
    ) -> None: ...


_current: RankSession | None = None
_current_lock = threading.Lock()


def install(factory: Callable[[], RankSession]) -> RankSession:
    """The process's session: built by ``factory`` the first time (the rank bootstrap,
    ``rankguard.init()``), the same one afterwards. Here, below the parts that take a
    session (the checkpoint manager, the in-process restart), so that they find the
    process's session without importing the module that builds it."""
    global _current
    with _current_lock:
        if _current is None:
            _current = factory()
        return _current


def current() -> RankSession | None:
    """The process's session, or None before ``rankguard.init()`` (or the bootstrap)."""
    return _current
