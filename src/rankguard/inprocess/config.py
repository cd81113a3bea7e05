"""In-process restart configuration (Megatron Bridge's ``InProcessRestartConfig`` names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rankguard.util.validate import check_number

__all__ = ["InProcessRestartConfig"]


@dataclass(kw_only=True, slots=True)
class InProcessRestartConfig:
    """Re-enter the training function in the same processes after a fault or a hang.

    The names and defaults are Megatron Bridge's (``cfg.inprocess_restart``); the
    restart budget per window is rankguard's own (past it, the process restart of
    ``rankguard run`` takes over)."""

    enabled: bool = field(
        default=False, metadata={"help": "Wrap the training function for in-process restart."}
    )
    granularity: Literal["node", "rank"] = field(
        default="node",
        metadata={
            "help": "Unit reported lost when a rank cannot re-enter: its node (node) or the "
            "rank alone (rank)."
        },
    )
    soft_timeout: float = field(
        default=60.0,
        metadata={
            "help": "Main thread stuck this long (no Python executed: a blocked collective, "
            "a blocking call): interrupt it, abort the communicator and re-enter."
        },
    )
    hard_timeout: float = field(
        default=90.0,
        metadata={
            "help": "Still stuck this long: the process exits and the launcher's in-job "
            "restart takes over."
        },
    )
    max_iterations: int | None = field(
        default=None,
        metadata={"help": "In-process restarts allowed in one process lifetime (None: no cap)."},
    )
    max_restarts_per_window: int = field(
        default=5,
        metadata={"help": "In-process restarts allowed within restart_window; then exit."},
    )
    restart_window: float = field(
        default=600.0, metadata={"help": "Seconds over which max_restarts_per_window counts."}
    )
    monitor_thread_interval: float = field(
        default=1.0,
        metadata={"help": "Seconds between two timeout checks of the rank's watcher thread."},
    )
    heartbeat_interval: float = field(
        default=1.0, metadata={"help": "Seconds between two store heartbeats of a rank."}
    )
    heartbeat_timeout: float = field(
        default=10.0,
        metadata={
            "help": "At re-entry, a peer whose process no rank can see (its host silent) is "
            "lost once its store heartbeat stopped this long or hard_timeout, whichever is "
            "longer; a rank on its host sees an exited process at once, a live one never."
        },
    )
    barrier_timeout: float = field(
        default=120.0, metadata={"help": "Longest wait for every rank at a re-entry."}
    )
    completion_timeout: float = field(
        default=120.0,
        metadata={"help": "Longest wait for every rank to finish once this one has."},
    )
    process_group_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Timeout of the process group the wrapper creates (None: just past "
            "soft_timeout on gloo, where a timed-out collective is recoverable; 600 s on "
            "NCCL, which must exceed hard_timeout)."
        },
    )
    backend: str | None = field(
        default=None, metadata={"help": "nccl or gloo (None: nccl when CUDA is available)."}
    )
    empty_cuda_cache: bool = field(
        default=True, metadata={"help": "Empty the CUDA cache between two rounds."}
    )
    standby_ranks: int = field(
        default=0,
        metadata={
            "help": "Warm standby worker processes per node (rankguard's own; "
            "--standby-ranks): a rank whose process is lost is replaced by one in place, "
            "the others re-enter in process (docs/live_recovery.md). 0: none."
        },
    )
    standby_refills: int | None = field(
        default=None,
        metadata={
            "help": "Standbys a node starts, over the run, to replace the ones that took "
            "a lost rank's place (each starts as the first ones did, so that a later loss "
            "is recovered live too). null: every used standby is replaced; 0: none."
        },
    )
    shrink_when_no_standby: bool = field(
        default=False,
        metadata={
            "help": "With standbys: a rank lost when no standby waits on its node no "
            "longer restarts the worker group (nor waits for a refill still starting); "
            "the other ranks go on in process with one rank fewer, renumbered 0..N-2, and "
            "grow back when a refill reaches its wait (docs/live_recovery.md). "
            "Only for a data-parallel job (DDP: every rank holds the whole state; the script "
            "calls ip.live_state) on one node; keep the global batch through "
            "rankguard's batch_plan."
        },
    )
    set_nccl_env: bool = field(
        default=True,
        metadata={
            "help": "Set TORCH_CPP_LOG_LEVEL=error, TORCH_NCCL_RETHROW_CUDA_ERRORS=0 and "
            "NCCL_NVLS_ENABLE=0 where the user has not."
        },
    )

    def __post_init__(self) -> None:
        if self.granularity not in ("node", "rank"):
            raise ValueError(f"granularity: node or rank, got {self.granularity!r}")
        for name in (
            "soft_timeout",
            "hard_timeout",
            "restart_window",
            "monitor_thread_interval",
            "heartbeat_interval",
            "heartbeat_timeout",
            "barrier_timeout",
            "completion_timeout",
        ):
            check_number(name, getattr(self, name), gt=0)
        check_number("max_restarts_per_window", self.max_restarts_per_window, ge=0)
        check_number("standby_ranks", self.standby_ranks, ge=0)
        if self.standby_refills is not None:
            check_number("standby_refills", self.standby_refills, ge=0)
        if self.max_iterations is not None:
            check_number("max_iterations", self.max_iterations, ge=0)
        if self.process_group_timeout is not None:
            check_number("process_group_timeout", self.process_group_timeout, gt=0)
        if self.backend not in (None, "nccl", "gloo"):
            raise ValueError(f"backend: nccl, gloo or null, got {self.backend!r}")
        if self.hard_timeout <= self.soft_timeout:
            raise ValueError(
                f"hard_timeout: must be > soft_timeout ({self.soft_timeout}), "
                f"got {self.hard_timeout}"
            )
        if self.monitor_thread_interval >= self.soft_timeout:
            raise ValueError(
                f"monitor_thread_interval: must be < soft_timeout ({self.soft_timeout}), "
                f"got {self.monitor_thread_interval}"
            )
        if self.heartbeat_interval >= self.heartbeat_timeout:
            raise ValueError(
                f"heartbeat_interval: must be < heartbeat_timeout ({self.heartbeat_timeout}), "
                f"got {self.heartbeat_interval}"
            )
