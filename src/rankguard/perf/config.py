"""Performance monitor configuration: FlagScale's perf monitor keys plus what TFLOP/s and
MFU need."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.perf.flops import ModelShape
from rankguard.validate import check_number

__all__ = ["PerfConfig", "PrometheusConfig"]

_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")


@dataclass(kw_only=True, slots=True)
class PrometheusConfig:
    """Opt-in metrics endpoint served by the launcher on node 0."""

    enabled: bool = field(default=False, metadata={"help": "Serve /metrics."})
    host: str = field(default="127.0.0.1", metadata={"help": "Bind address (loopback)."})
    port: int = field(default=9464, metadata={"help": "TCP port; 0 picks a free one."})
    rank_series: int = field(
        default=64,
        metadata={
            "help": "Per-rank series (about 37 a rank) for at most this many ranks, those "
            "most in need of a look first; job-level series always (0: none per rank)."
        },
    )
    all_rank_series: bool = field(
        default=False,
        metadata={"help": "Per-rank series for every rank, whatever the job's size."},
    )

    def __post_init__(self) -> None:
        check_number("port", self.port, ge=0, le=65535)
        check_number("rank_series", self.rank_series, ge=0)
        if not self.host:
            raise ValueError("host: must not be empty")


@dataclass(kw_only=True, slots=True)
class PerfConfig:
    """Step time, throughput, TFLOP/s, MFU and memory, logged every ``log_interval``."""

    enabled: bool = field(default=True, metadata={"help": "Measure performance."})
    log_interval: int = field(
        default=10, metadata={"help": "Log at iteration 1 and every N iterations."}
    )
    warmup_iterations: int = field(
        default=3,
        metadata={
            "help": "Steps left out of the final averages (compilation, allocator and "
            "data-loader warm-up). Runs shorter than twice this use their second half."
        },
    )
    dtype: str = field(
        default="bf16", metadata={"help": "Peak column for MFU: " + "/".join(_DTYPES)}
    )
    peak_tflops: float | None = field(
        default=None, metadata={"help": "Peak TFLOP/s per GPU; overrides the device table."}
    )
    flops_per_step: float | None = field(
        default=None,
        metadata={"help": "Training FLOPs of one optimizer step, global batch (all ranks)."},
    )
    model: ModelShape | None = field(
        default=None, metadata={"help": "Model shape for Megatron's analytic FLOP formula."}
    )
    autodetect: bool = field(
        default=True,
        metadata={
            "help": "Find the batch shape and FLOPs of a script that sets neither, from its "
            "root module's first forward (hooks removed after the third optimizer step)."
        },
    )
    keep_runs: int = field(
        default=20, metadata={"help": "perf_monitor/ keeps the newest N runs' files of this job."}
    )
    console: bool = field(default=True, metadata={"help": "Rank 0 prints one line per log."})
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)

    def __post_init__(self) -> None:
        check_number("log_interval", self.log_interval, ge=1)
        check_number("warmup_iterations", self.warmup_iterations, ge=0)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {list(_DTYPES)}, got {self.dtype!r}")
        for name in ("peak_tflops", "flops_per_step"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), gt=0)
        check_number("keep_runs", self.keep_runs, ge=1)
