"""Straggler detection configuration (NVRx's keys and defaults, as Megatron Bridge sets them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.util.validate import check_number

__all__ = ["StragglerConfig"]


@dataclass(kw_only=True, slots=True)
class StragglerConfig:
    enabled: bool = field(default=False, metadata={"help": "Measure ranks and score them."})
    report_time_interval: float = field(
        default=300.0, metadata={"help": "Seconds between two score reports."}
    )
    calc_relative_gpu_perf: bool = field(
        default=True, metadata={"help": "Score each rank against the best rank."}
    )
    calc_individual_gpu_perf: bool = field(
        default=True, metadata={"help": "Score each rank against its own best report."}
    )
    num_gpu_perf_scores_to_print: int = field(
        default=5, metadata={"help": "Best and worst N ranks in each report (0: none)."}
    )
    gpu_relative_perf_threshold: float = field(
        default=0.7, metadata={"help": "Relative score below this: straggler."}
    )
    gpu_individual_perf_threshold: float = field(
        default=0.7, metadata={"help": "Individual score below this: straggler."}
    )
    consecutive_reports: int = field(
        default=2,
        metadata={
            "help": "Reports in a row a score must stay below its threshold before the rank "
            "is a straggler (1: the first; more: no finding for a score wavering at the "
            "threshold)."
        },
    )
    stop_if_detected: bool = field(
        default=False, metadata={"help": "All ranks agree on a step, checkpoint and stop."}
    )
    enable_logging: bool = field(default=True, metadata={"help": "Print each score report."})
    profiling_interval: int = field(default=1, metadata={"help": "Measure every N-th step."})

    def __post_init__(self) -> None:
        check_number("report_time_interval", self.report_time_interval, gt=0)
        check_number("num_gpu_perf_scores_to_print", self.num_gpu_perf_scores_to_print, ge=0)
        for name in ("gpu_relative_perf_threshold", "gpu_individual_perf_threshold"):
            check_number(name, getattr(self, name), gt=0, le=1)
        check_number("profiling_interval", self.profiling_interval, ge=1)
        check_number("consecutive_reports", self.consecutive_reports, ge=1)
