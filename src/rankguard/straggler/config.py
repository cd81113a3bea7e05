"""Straggler detection configuration (NVRx's keys and defaults, as Megatron Bridge sets them)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    stop_if_detected: bool = field(
        default=False, metadata={"help": "All ranks agree on a step, checkpoint and stop."}
    )
    enable_logging: bool = field(default=True, metadata={"help": "Print each score report."})
    profiling_interval: int = field(default=1, metadata={"help": "Measure every N-th step."})

    def __post_init__(self) -> None:
        if self.report_time_interval <= 0:
            raise ValueError(f"report_time_interval: must be > 0, got {self.report_time_interval}")
        if self.num_gpu_perf_scores_to_print < 0:
            raise ValueError("num_gpu_perf_scores_to_print: must be >= 0")
        for name in ("gpu_relative_perf_threshold", "gpu_individual_perf_threshold"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {value}")
        if self.profiling_interval < 1:
            raise ValueError(f"profiling_interval: must be >= 1, got {self.profiling_interval}")
