"""Findings and rank states: the monitor's verdict vocabulary, in one place.

:class:`FindingType` is the only list of finding types. Everything that treats types
differently derives from it: the fault-tolerance actions and their defaults
(:attr:`FindingInfo.default_action`), which types are hangs (:attr:`FindingInfo.hang`),
the status screen's short names and colours, the report's markers and the exporter's
series. A test fails when one of them misses a type.

How to add a finding type: a member here with its :data:`_INFO` entry, the evaluator that
fires it (a rule in :mod:`rankguard.monitor.rules` or a
:class:`~rankguard.monitor.monitor.Evaluator`), a marker in ``report/charts.py`` and a
line in ``docs/heartbeat.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from rankguard.schema.flagscale import FLAGSCALE_KEYS, flagscale_fields
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.records import SCHEMA_VERSION, HeartbeatRecord

__all__ = ["Finding", "FindingInfo", "FindingType", "Liveness", "Progress", "Reason"]


class Liveness(str, Enum):
    """Is the rank's process (and its heartbeat thread) alive?"""

    NOT_OBSERVED = "not_observed"
    ALIVE = "alive"
    STALE = "stale"
    EXITED = "exited"


class Progress(str, Enum):
    """Is the rank's step counter advancing?"""

    NOT_OBSERVED = "not_observed"
    STARTING = "starting"
    PROGRESSING = "progressing"
    STALLED = "stalled"
    UNKNOWN = "unknown"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class FindingInfo:
    short: str  # column-width name (``rankguard status``)
    title: str  # human label (report legend)
    severity: str  # "error" or "warning"
    hang: bool  # a hang: the job exits EXIT_HANG when it ends the job
    default_action: str  # fault_tolerance.actions default: report, restart or abort


class FindingType(str, Enum):
    PROCESS_TIMEOUT = "rank_process_heartbeat_timeout"
    PROGRESS_TIMEOUT = "gpu_progress_timeout"
    PROCESS_EXITED = "rank_process_exited"
    HEALTH_FAILURE = "gpu_hardware_health_failure"
    HEALTH_WARNING = "gpu_hardware_health_warning"
    SECTION_TIMEOUT = "rank_section_timeout"
    STRAGGLER = "straggler_detected"
    NODE_DISK_FULL = "node_disk_full"
    RERUN_TRANSIENT_FAULT = "rerun_transient_fault"
    RERUN_PERSISTENT_FAULT = "rerun_persistent_fault"
    RERUN_VALIDATION_FAILED = "rerun_validation_failed"
    RERUN_REPRODUCIBLE_FAULT = "rerun_reproducible_fault"
    PREEMPTED = "job_preempted"
    INPROCESS_RESTART = "inprocess_restart"
    WORKER_FAILED = "worker_failed"  # the agent's root cause of a failed worker group
    NODE_EXCLUDED = "node_excluded"  # bad-node exclusion: a node left the job
    NODE_HEALTH_FAILURE = "node_health_failure"  # a NIC link or the storage failed its check
    UNINTERRUPTIBLE = "rank_uninterruptible_sleep"  # a worker stuck in D state

    @property
    def info(self) -> FindingInfo:
        return _INFO[self]

    @classmethod
    def parse(cls, value: Any) -> FindingType | None:
        """The type named ``value``, or None for an unknown name (a newer writer)."""
        try:
            return cls(value)
        except ValueError:
            return None


_INFO: dict[FindingType, FindingInfo] = {
    FindingType.PROCESS_TIMEOUT: FindingInfo(
        "hb_timeout", "heartbeat timeout", "error", True, "restart"
    ),
    FindingType.PROGRESS_TIMEOUT: FindingInfo(
        "prog_timeout", "progress timeout", "error", True, "restart"
    ),
    FindingType.PROCESS_EXITED: FindingInfo("exited", "process exited", "error", False, "restart"),
    FindingType.HEALTH_FAILURE: FindingInfo(
        "gpu_fail", "GPU health failure", "error", False, "report"
    ),
    FindingType.HEALTH_WARNING: FindingInfo(
        "gpu_warn", "GPU health warning", "warning", False, "report"
    ),
    FindingType.SECTION_TIMEOUT: FindingInfo(
        "sect_timeout", "section timeout", "error", True, "restart"
    ),
    FindingType.STRAGGLER: FindingInfo("straggler", "straggler", "warning", False, "report"),
    FindingType.NODE_DISK_FULL: FindingInfo(
        "disk_full", "node disk full", "error", False, "report"
    ),
    # The rerun state machine's verdicts: the ranks act on them themselves (continue,
    # exit 16, exit 17, stop or skip), so the launcher only reports them.
    FindingType.RERUN_TRANSIENT_FAULT: FindingInfo(
        "rr_transient", "rerun: transient fault", "warning", False, "report"
    ),
    FindingType.RERUN_PERSISTENT_FAULT: FindingInfo(
        "rr_persist", "rerun: reproduced in place (exit 16)", "error", False, "report"
    ),
    FindingType.RERUN_VALIDATION_FAILED: FindingInfo(
        "rr_bad_gpu", "rerun: faulty GPU (exit 17)", "error", False, "report"
    ),
    FindingType.RERUN_REPRODUCIBLE_FAULT: FindingInfo(
        "rr_repro", "rerun: reproducible (data or model)", "error", False, "report"
    ),
    FindingType.PREEMPTED: FindingInfo("preempted", "preempted", "warning", False, "report"),
    # Recovered already, inside the ranks: the launcher only records it.
    FindingType.INPROCESS_RESTART: FindingInfo(
        "inproc_restart", "in-process restart", "warning", False, "report"
    ),
    # What torch elastic's agent saw: a worker exited with an error or a signal. The
    # agent restarts the group itself (its restart budget), so restart is its only action.
    FindingType.WORKER_FAILED: FindingInfo(
        "worker_failed", "worker failed", "error", False, "restart"
    ),
    # Written by the excluded node's own launcher (launcher/exclusion.py), which acted
    # already (it left the rendezvous): nothing for the monitor to do but report.
    FindingType.NODE_EXCLUDED: FindingInfo("excluded", "node excluded", "error", False, "report"),
    # The node's own checks (health/node_checks.py): it acts through bad-node exclusion
    # (it leaves before the next round) when that is on; the monitor only reports.
    FindingType.NODE_HEALTH_FAILURE: FindingInfo(
        "node_fail", "node health failure", "error", False, "report"
    ),
    FindingType.UNINTERRUPTIBLE: FindingInfo(
        "d_state", "uninterruptible sleep", "error", False, "report"
    ),
}


class Reason(str, Enum):
    NEVER_OBSERVED = "rank_process_heartbeat_never_observed"
    UNRESPONSIVE = "rank_process_or_heartbeat_thread_unresponsive"
    NOT_ADVANCING = "rank_alive_but_gpu_progress_not_advancing"
    EXITED_WITH_ERROR = "rank_process_exited_with_error"
    DIED = "rank_process_died_without_process_end"
    GPU_UNHEALTHY = "gpu_unhealthy"
    GPU_WARNING = "gpu_warning"
    SECTION_EXCEEDED = "rank_section_exceeded_its_timeout"
    OUT_OF_SECTION = "rank_out_of_section_too_long"
    SLOW_COMPUTE = "rank_compute_slower_than_threshold"
    DISK_FULL = "heartbeats_unwritable_on_a_full_disk"
    RERUN_DIFFERED_IN_PLACE = "rerun_result_differed_in_place"
    RERUN_SAME_IN_PLACE = "rerun_result_reproduced_in_place"
    RERUN_DIFFERED_ELSEWHERE = "rerun_result_differed_after_resume"
    RERUN_SAME_ELSEWHERE = "rerun_result_reproduced_after_resume"
    EXIT_SIGNAL = "scheduler_sent_the_exit_signal"
    PREEMPTION_SAVED = "every_rank_saved_the_agreed_step"
    PREEMPTION_NOT_SAVED = "ranks_stopped_without_every_one_saving_the_agreed_step"
    PREEMPTION_AFTER_TRAINING = "every_rank_finished_training_before_the_agreed_step"
    INPROCESS_EXCEPTION = "rank_raised_and_every_rank_reentered_in_process"
    INPROCESS_HANG = "rank_stuck_past_soft_timeout_and_every_rank_reentered_in_process"
    INPROCESS_OTHER = "collective_failed_and_every_rank_reentered_in_process"
    LIVE_REPLACED = "rank_lost_and_a_standby_took_its_place_in_process"
    EXCLUDED_UNHEALTHY_GPU = "node_gpu_failed_its_check_before_the_round"
    EXCLUDED_RESTARTS = "node_ranks_caused_too_many_restarts_in_the_window"
    EXCLUDED_RERUN = "node_gpu_found_faulty_by_the_rerun_state_machine"
    EXCLUDED_BELOW_MIN = "nodes_left_after_exclusion_below_min_nodes"
    NODE_CHECK_FAILED = "node_nic_or_storage_failed_its_check"
    UNINTERRUPTIBLE_SLEEP = "rank_in_uninterruptible_sleep_past_its_timeout"
    EXCLUDED_NODE_HEALTH = "node_failed_its_nic_storage_or_worker_check"
    # A line read back without a reason (a partial line, an older writer): never written.
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Finding:
    """One line of ``findings.jsonl`` (schema in ``docs/heartbeat.md``).

    Sinks may fill in ``action`` and the stack dumps before the finding is written;
    ``detail`` holds what only one type has (a straggler's scores), written at the top
    level of the line like every other field.
    """

    finding_type: FindingType
    run_id: str
    rank: int
    reason: Reason
    message: str
    pid: int | None = None
    hostname: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    process_liveness: Liveness | None = None
    gpu_progress: Progress | None = None
    phase: str | None = None
    iteration: int | None = None
    checkpoint_active: bool = False
    timeout_s: float | None = None
    observed_s: float | None = None
    gpu: JsonObject | None = None
    gpu_health: JsonObject | None = None
    exit: JsonObject | None = None
    main_frame: str | None = None
    schema_version: int = SCHEMA_VERSION
    detected_wall_time: str | None = None
    action: str | None = None
    stack_dumps: dict[str, str] | None = None
    stack_dump: str | None = None
    detail: JsonObject = field(default_factory=dict)

    @property
    def info(self) -> FindingInfo:
        return self.finding_type.info

    @classmethod
    def build(
        cls,
        finding_type: FindingType,
        reason: Reason,
        *,
        run_id: str,
        rank: int,
        message: str,
        record: HeartbeatRecord | None = None,
        **fields: Any,
    ) -> Finding:
        """The one way to make a finding: the rank's identity and place (pid, host, node,
        local rank, phase, iteration, GPU) from its latest ``record`` when there is one,
        then ``fields`` (any other field of :class:`Finding`, ``detail`` for what only
        this type has), which win over the record's."""
        where: dict[str, Any] = {}  # keyword arguments of Finding
        if record is not None:
            where = {
                "pid": record.pid,
                "hostname": record.hostname,
                "node_rank": record.node_rank,
                "local_rank": record.local_rank,
                "phase": record.phase,
                "iteration": record.iteration,
                "gpu": record.gpu,
            }
        where.update(fields)
        return cls(
            finding_type=finding_type,
            run_id=run_id,
            rank=rank,
            reason=reason,
            message=message,
            **where,
        )

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"schema_version": self.schema_version}
        for name in _FIELDS:
            value = getattr(self, name)
            if name in _OMIT_WHEN_NONE and value is None:
                continue
            out[name] = value.value if isinstance(value, Enum) else value
        out.update(self.detail)
        out.update(flagscale_fields(out))  # FlagScale's names for the same facts
        return out

    @classmethod
    def from_dict(cls, d: JsonObject) -> Finding:
        """A finding read back from ``findings.jsonl``; ValueError names a bad field
        (an unknown type or reason, a rank that is not an integer). Missing fields take
        their defaults (a missing reason reads as ``unknown``); an unknown liveness or
        progress word reads as None."""
        ftype = FindingType.parse(d.get("finding_type"))
        if ftype is None:
            raise ValueError(f"finding_type: unknown {d.get('finding_type')!r:.60}")
        try:
            reason = Reason(d.get("reason") or Reason.UNKNOWN)
        except ValueError:
            raise ValueError(f"reason: unknown {d.get('reason')!r:.60}") from None
        rank = d.get("rank")
        if rank is None:
            rank = -1  # about no one rank (the job, a node)
        elif type(rank) is not int:
            raise ValueError("rank: expected an integer")
        known: dict[str, Any] = {}  # keyword arguments of Finding
        detail: JsonObject = {}
        for key, value in d.items():
            if key in FLAGSCALE_KEYS:
                continue  # FlagScale's names, derived again by to_dict
            (known if key in _KNOWN else detail)[key] = value
        known["finding_type"], known["reason"], known["rank"] = ftype, reason, rank
        # a partial line (an older writer, a hand-cut file) still reads
        known["run_id"] = str(known.get("run_id") or "")
        known["message"] = str(known.get("message") or "")
        for key, enum in (("process_liveness", Liveness), ("gpu_progress", Progress)):
            value = known.get(key)
            if value is not None:
                known[key] = enum(value) if value in enum._value2member_map_ else None
        return cls(**known, detail=detail)


_FIELDS = tuple(f.name for f in fields(Finding) if f.name not in ("detail", "schema_version"))
_KNOWN = frozenset((*_FIELDS, "schema_version"))
# Present only once set (by the monitor when written, by fault tolerance when it acts).
_OMIT_WHEN_NONE = frozenset({"detected_wall_time", "action", "stack_dumps", "stack_dump"})
