"""Fault-tolerance configuration (NVRx's and Megatron Bridge's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.schema.findings import FindingType
from rankguard.util.configdoc import FrozenDict
from rankguard.util.validate import check_number

__all__ = ["ACTIONS", "FAULT_TYPES", "FINDING_TYPES", "FaultToleranceConfig"]

ACTIONS = ("report", "restart", "abort")
FINDING_TYPES = tuple(t.value for t in FindingType)
FAULT_TYPES = ("rank_hung", "rank_killed", "rank_stalled", "random")


def _default_actions() -> dict[str, str]:
    return {t.value: t.info.default_action for t in FindingType}


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultToleranceConfig:
    """What to do when the monitor finds a fault, and how to restart."""

    enable_ft_package: bool = field(
        default=False,
        metadata={"help": "Act on findings (stack dumps, restarts); needs heartbeat.enabled."},
    )
    num_in_job_restarts: int = field(
        default=0, metadata={"help": "Worker-group restarts inside one launch."}
    )
    num_job_retries_on_failure: int = field(
        default=0, metadata={"help": "Scheduler-level retries (rankguard slurm); see exit codes."}
    )
    actions: dict[str, str] = field(
        default_factory=_default_actions,
        metadata={"help": "finding_type -> report | restart | abort."},
    )
    stack_dump: str = field(
        default="auto", metadata={"help": "auto (py-spy if on PATH) | py-spy | faulthandler"}
    )
    stack_dump_timeout_s: float = field(default=10.0, metadata={"help": "Per rank."})
    termination_grace_s: float = field(
        default=10.0, metadata={"help": "SIGTERM -> this long -> SIGKILL for the workers."}
    )
    handover_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "At a restart, wait at most this long for the old workers to be gone "
            "and their GPU memory freed (NVML) before new ones start."
        },
    )
    rank_section_timeouts: dict[str, float] = field(
        default_factory=dict,
        metadata={"help": "section -> timeout s, e.g. setup:600,step:180,checkpointing:420."},
    )
    rank_out_of_section_timeout: float | None = field(
        default=None, metadata={"help": "Time in a phase that has no section timeout."}
    )
    initial_rank_heartbeat_timeout: float | None = field(
        default=None, metadata={"help": "NVRx's name; sets heartbeat.initial_process_timeout_s."}
    )
    rank_heartbeat_timeout: float | None = field(
        default=None, metadata={"help": "NVRx's name; sets heartbeat.process_timeout_s."}
    )
    calc_ft_timeouts: bool = field(
        default=False, metadata={"help": "Learn timeouts from this run; reuse them next run."}
    )
    safety_factor: float = field(default=5.0, metadata={"help": "Learned = max seen x this."})
    min_learned_timeout_s: float = field(
        default=60.0, metadata={"help": "Floor of any learned timeout."}
    )
    state_dir: str | None = field(
        default=None, metadata={"help": "Where ft_state.json lives (next to checkpoints)."}
    )
    serve_nvrx_client: bool = field(
        default=True,
        metadata={
            "help": "Serve NVRx's RankMonitorClient in each rank (ft_launcher's rank monitor) "
            "when nvidia-resiliency-ext is installed."
        },
    )
    exclude_bad_nodes: bool = field(
        default=False,
        metadata={
            "help": "Bad-node exclusion: before each rendezvous round, a node whose GPU "
            "fails its health check (NVML: XID error, uncorrected ECC, retired pages "
            "pending, row-remap failure, recovery action, GPU lost), or whose GPU the rerun "
            "state machine found faulty (exit 17), leaves the job (exit 15); the others go "
            "on when --nnodes MIN allows."
        },
    )
    exclude_after_restarts: int = field(
        default=0,
        metadata={
            "help": "Bad-node exclusion: a node whose ranks caused this many in-job "
            "restarts within exclude_window_s leaves the job (0: never)."
        },
    )
    exclude_window_s: float = field(
        default=3600.0,
        metadata={"help": "The window exclude_after_restarts counts restarts in (seconds)."},
    )
    max_no_progress_restarts: int = field(
        default=3,
        metadata={
            "help": "Stop the job (exit 18) after this many attempts in a row that got no "
            "further than the iteration reached before them, unless the last failure is "
            "transient (a signal, a hang, a lost peer, a GPU error); 0: never."
        },
    )
    max_no_progress_cycles: int | None = field(
        default=None, metadata={"help": "NVRx's name; sets max_no_progress_restarts."}
    )
    simulate_fault: bool = field(default=False, metadata={"help": "Inject one fault to test."})
    simulated_fault_type: str = field(default="random", metadata={"help": "/".join(FAULT_TYPES)})
    simulated_fault_rank: int | None = field(
        default=None, metadata={"help": "Target rank; default a random one."}
    )
    simulated_fault_base_delay: float = field(
        default=10.0, metadata={"help": "Seconds before the fault (plus up to as much again)."}
    )

    def __post_init__(self) -> None:
        for name in ("num_in_job_restarts", "num_job_retries_on_failure"):
            check_number(name, getattr(self, name), ge=0)
        for finding, action in self.actions.items():
            if finding not in FINDING_TYPES:
                raise ValueError(
                    f"actions.{finding}: not a finding type; one of {list(FINDING_TYPES)}"
                )
            if action not in ACTIONS:
                raise ValueError(
                    f"actions.{finding}: must be one of {list(ACTIONS)}, got {action!r}"
                )
            if finding == FindingType.PREEMPTED.value and action != "report":
                raise ValueError(
                    f"actions.{finding}: only report (a preemption is not a fault: the "
                    f"job saves and exits to be requeued), got {action!r}"
                )
            if finding == FindingType.NODE_EXCLUDED.value and action != "report":
                raise ValueError(
                    f"actions.{finding}: only report (the excluded node's launcher acted: "
                    f"it left the job), got {action!r}"
                )
            if finding == FindingType.WORKER_FAILED.value and action != "restart":
                raise ValueError(
                    f"actions.{finding}: only restart (torch elastic's agent restarts a "
                    f"failed worker group within the restart budget), got {action!r}"
                )
        # read-only like the sections: a change is a new configuration
        object.__setattr__(self, "actions", FrozenDict({**_default_actions(), **self.actions}))
        if self.stack_dump not in ("auto", "py-spy", "faulthandler"):
            raise ValueError(f"stack_dump: auto, py-spy or faulthandler, got {self.stack_dump!r}")
        for name in ("stack_dump_timeout_s", "termination_grace_s", "handover_timeout_s"):
            check_number(name, getattr(self, name), gt=0)
        check_number("safety_factor", self.safety_factor, ge=1)
        for section, timeout in self.rank_section_timeouts.items():
            check_number(f"rank_section_timeouts.{section}", timeout, gt=0)
        # the sections of a frozen configuration: read-only (a change is a new config)
        object.__setattr__(self, "rank_section_timeouts", FrozenDict(self.rank_section_timeouts))
        for name in (
            "rank_out_of_section_timeout",
            "initial_rank_heartbeat_timeout",
            "rank_heartbeat_timeout",
        ):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), gt=0)
        if self.simulated_fault_rank is not None:
            check_number("simulated_fault_rank", self.simulated_fault_rank, ge=0)
        if self.simulated_fault_type not in FAULT_TYPES:
            raise ValueError(
                f"simulated_fault_type: one of {list(FAULT_TYPES)}, "
                f"got {self.simulated_fault_type!r}"
            )
        check_number("simulated_fault_base_delay", self.simulated_fault_base_delay, ge=0)
        check_number("min_learned_timeout_s", self.min_learned_timeout_s, gt=0)
        check_number("exclude_after_restarts", self.exclude_after_restarts, ge=0)
        check_number("exclude_window_s", self.exclude_window_s, gt=0)
        check_number("max_no_progress_restarts", self.max_no_progress_restarts, ge=0)
        if self.max_no_progress_cycles is not None:
            check_number("max_no_progress_cycles", self.max_no_progress_cycles, ge=0)

    @property
    def no_progress_limit(self) -> int:
        """``max_no_progress_restarts``, or NVRx's ``max_no_progress_cycles`` when set."""
        if self.max_no_progress_cycles is not None:
            return self.max_no_progress_cycles
        return self.max_no_progress_restarts

    @property
    def exclusion(self) -> bool:
        """Is bad-node exclusion on (any of its triggers)?"""
        return self.exclude_bad_nodes or self.exclude_after_restarts > 0
