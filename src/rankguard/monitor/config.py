"""Heartbeat monitoring configuration (FlagScale's heartbeat keys and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.health.config import HardwareHealthConfig
from rankguard.rank.phases import check_patterns
from rankguard.util.validate import check_number

__all__ = ["HardwareHealthConfig", "HeartbeatConfig"]


@dataclass(kw_only=True, slots=True, frozen=True)
class HeartbeatConfig:
    """Per-rank liveness and progress heartbeats and the job monitor's timeouts; frozen
    once validated (a change makes a new one: :func:`dataclasses.replace`). The delays
    derived from it are :class:`rankguard.schema.cadence.Cadence`'s."""

    enabled: bool = field(default=False, metadata={"help": "Turn heartbeat monitoring on."})
    publish_interval_s: float = field(
        default=5.0, metadata={"help": "Seconds between heartbeat records of a rank."}
    )
    initial_process_timeout_s: float = field(
        default=30.0, metadata={"help": "A rank not seen this long after start is reported."}
    )
    process_timeout_s: float = field(
        default=30.0, metadata={"help": "No heartbeat for this long: process unresponsive."}
    )
    initial_progress_timeout_s: float = field(
        default=600.0, metadata={"help": "Progress timeout before the first completed step."}
    )
    progress_timeout_s: float = field(
        default=300.0, metadata={"help": "Heartbeats arrive but no step completes this long."}
    )
    checkpoint_timeout_s: float = field(
        default=1800.0, metadata={"help": "Process and progress timeout while checkpointing."}
    )
    eval_timeout_s: float = field(
        default=1800.0,
        metadata={"help": "Progress timeout while the rank evaluates (phase eval)."},
    )
    phase_detection: bool = field(
        default=True,
        metadata={
            "help": "Recognise evaluation and checkpoint saving from the main thread's "
            "stack at each heartbeat (no code needed); see docs/heartbeat.md."
        },
    )
    phase_patterns: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "More functions that mark a phase, checked before the built-in table: "
            "'module.qualname' pattern (* within a dotted part, **. any leading parts) "
            "-> eval | checkpointing | none | a section name, e.g. "
            "'**.run_benchmark:eval,mypkg.io.dump_all:checkpointing'."
        },
    )
    scan_interval_s: float = field(
        default=1.0, metadata={"help": "Seconds between two evaluations by the monitor."}
    )
    max_file_mb: float = field(
        default=16.0,
        metadata={
            "help": "A heartbeat file about to grow past this many megabytes (10^6 bytes) "
            "moves to <name>.1 and a new one starts with the process_start record "
            "(0: never rotate)."
        },
    )
    mirror_relayed_max_ranks: int = field(
        default=4096,
        metadata={
            "help": "Node 0 keeps a local copy of other nodes' heartbeat files (for the "
            "report) while the job has at most this many ranks (0: never)."
        },
    )
    status_rank_rows: int = field(
        default=4096,
        metadata={
            "help": "status.json lists every rank up to this many ranks; a larger job lists "
            "the status_worst_ranks worst and writes all of them to status_ranks.json."
        },
    )
    status_worst_ranks: int = field(
        default=100,
        metadata={"help": "Ranks listed in status.json above status_rank_rows (worst first)."},
    )
    status_detail_interval_s: float = field(
        default=30.0,
        metadata={"help": "Seconds between two rewrites of status_ranks.json (large jobs)."},
    )
    incremental_rules: bool = field(
        default=True,
        metadata={
            "help": "Evaluate only the ranks with a new record or a timeout due in a scan "
            "(same verdicts as evaluating every rank; false: every rank every scan)."
        },
    )
    hardware_health: HardwareHealthConfig = field(default_factory=HardwareHealthConfig)

    @property
    def max_file_bytes(self) -> int:
        """``max_file_mb`` in bytes (0: never rotate)."""
        return int(self.max_file_mb * 1_000_000)

    def __post_init__(self) -> None:
        check_number("max_file_mb", self.max_file_mb, ge=0)
        check_number("mirror_relayed_max_ranks", self.mirror_relayed_max_ranks, ge=0)
        check_number("status_rank_rows", self.status_rank_rows, ge=0)
        check_number("status_worst_ranks", self.status_worst_ranks, ge=0)
        check_number("status_detail_interval_s", self.status_detail_interval_s, gt=0)
        for name in (
            "publish_interval_s",
            "scan_interval_s",
            "initial_process_timeout_s",
            "process_timeout_s",
            "initial_progress_timeout_s",
            "progress_timeout_s",
            "checkpoint_timeout_s",
            "eval_timeout_s",
        ):
            check_number(name, getattr(self, name), gt=0)
        for name in (
            "initial_process_timeout_s",
            "process_timeout_s",
            "initial_progress_timeout_s",
            "progress_timeout_s",
            "checkpoint_timeout_s",
            "eval_timeout_s",
        ):
            value = getattr(self, name)
            if value <= self.publish_interval_s:
                raise ValueError(
                    f"{name}: must be > publish_interval_s ({self.publish_interval_s}), got {value}"
                )
        if self.checkpoint_timeout_s < self.progress_timeout_s:
            raise ValueError(
                f"checkpoint_timeout_s: must be >= progress_timeout_s "
                f"({self.progress_timeout_s}), got {self.checkpoint_timeout_s}"
            )
        if self.eval_timeout_s < self.progress_timeout_s:
            raise ValueError(
                f"eval_timeout_s: must be >= progress_timeout_s "
                f"({self.progress_timeout_s}), got {self.eval_timeout_s}"
            )
        check_patterns(self.phase_patterns)
