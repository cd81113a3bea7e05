"""Performance monitor configuration: FlagScale's perf monitor keys plus what TFLOP/s and
MFU need."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankguard.perf.flops import ModelShape
from rankguard.util.validate import check_number

__all__ = [
    "TRACKERS",
    "TRACKER_RANKS",
    "MlflowConfig",
    "PerfConfig",
    "PrometheusConfig",
    "TensorBoardConfig",
    "WandbConfig",
]

_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
#: The trackers ``perf.trackers`` may name (one module each under ``perf/trackers/``).
TRACKERS = ("tensorboard", "wandb", "mlflow")
#: ``perf.tracker_ranks``: rank 0 only, or one tracker run per rank.
TRACKER_RANKS = ("rank0", "all")
_WANDB_MODES = ("online", "offline", "disabled", "shared")


def _optional_text(name: str, value: str | None) -> None:
    if value is not None and not value.strip():
        raise ValueError(f"{name}: must not be empty (leave it unset for the default)")


@dataclass(kw_only=True, slots=True)
class TensorBoardConfig:
    """``perf.tensorboard``: event files written with TensorBoard's own writer."""

    log_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory of the event files (default: <log_dir>/perf_monitor/<run_id>/"
            "tensorboard, so `tensorboard --logdir <log_dir>/perf_monitor` shows every run)."
        },
    )
    flush_secs: float = field(
        default=10.0, metadata={"help": "Seconds between flushes of the event file."}
    )

    def __post_init__(self) -> None:
        _optional_text("log_dir", self.log_dir)
        check_number("flush_secs", self.flush_secs, gt=0, le=3600)


@dataclass(kw_only=True, slots=True)
class WandbConfig:
    """``perf.wandb``: a Weights & Biases run (or the script's own run, if it has one)."""

    project: str | None = field(
        default=None, metadata={"help": "W&B project (default: WANDB_PROJECT or W&B's own)."}
    )
    entity: str | None = field(default=None, metadata={"help": "W&B entity (team or user)."})
    name: str | None = field(default=None, metadata={"help": "Run name (default: the run id)."})
    group: str | None = field(
        default=None,
        metadata={"help": "Run group (default: the run id when every rank has a run)."},
    )
    dir: str | None = field(
        default=None, metadata={"help": "Directory of W&B's files (default: W&B's own)."}
    )
    mode: str | None = field(
        default=None,
        metadata={"help": "online/offline/disabled/shared (default: WANDB_MODE or online)."},
    )

    def __post_init__(self) -> None:
        for name in ("project", "entity", "name", "group", "dir"):
            _optional_text(name, getattr(self, name))
        if self.mode is not None and self.mode not in _WANDB_MODES:
            raise ValueError(f"mode: must be one of {list(_WANDB_MODES)}, got {self.mode!r}")


@dataclass(kw_only=True, slots=True)
class MlflowConfig:
    """``perf.mlflow``: an MLflow run (or the script's active run, if it has one)."""

    tracking_uri: str | None = field(
        default=None,
        metadata={"help": "Tracking URI (default: MLFLOW_TRACKING_URI or MLflow's own)."},
    )
    experiment: str | None = field(
        default=None,
        metadata={"help": "Experiment name (default: MLFLOW_EXPERIMENT_NAME or MLflow's)."},
    )
    run_name: str | None = field(default=None, metadata={"help": "Run name (default: the run id)."})

    def __post_init__(self) -> None:
        for name in ("tracking_uri", "experiment", "run_name"):
            _optional_text(name, getattr(self, name))


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
    flagscale_summary_link: bool = field(
        default=False,
        metadata={
            "help": "Also show the summary at FlagScale's path, <log_dir>/perf_monitor/"
            "perf_summary_<ts>.json (a link; set by a FlagScale file's experiment.exp_dir)."
        },
    )
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    trackers: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Where windows, findings, restarts and checkpoints also go: any of "
            + ", ".join(TRACKERS)
            + " (written by the perf thread, never the training thread)."
        },
    )
    tracker_ranks: str = field(
        default="rank0",
        metadata={"help": "rank0: one tracker run for the job; all: one run per rank."},
    )
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def __post_init__(self) -> None:
        unknown = [t for t in self.trackers if t not in TRACKERS]
        if unknown:
            raise ValueError(
                f"trackers: unknown {', '.join(map(repr, unknown))}; allowed: {', '.join(TRACKERS)}"
            )
        if len(set(self.trackers)) != len(self.trackers):
            raise ValueError(f"trackers: each tracker at most once, got {self.trackers}")
        if self.tracker_ranks not in TRACKER_RANKS:
            raise ValueError(
                f"tracker_ranks: must be one of {list(TRACKER_RANKS)}, got {self.tracker_ranks!r}"
            )
        check_number("log_interval", self.log_interval, ge=1)
        check_number("warmup_iterations", self.warmup_iterations, ge=0)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {list(_DTYPES)}, got {self.dtype!r}")
        for name in ("peak_tflops", "flops_per_step"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), gt=0)
        check_number("keep_runs", self.keep_runs, ge=1)

    def warnings(self) -> list[str]:
        """Tracker settings that cannot take effect: one line each."""
        out = []
        if self.trackers and not self.enabled:
            out.append(
                f"perf.trackers={','.join(self.trackers)} has NO effect while perf.enabled=false"
            )
        defaults = {
            "tensorboard": TensorBoardConfig(),
            "wandb": WandbConfig(),
            "mlflow": MlflowConfig(),
        }
        for name, default in defaults.items():
            if getattr(self, name) != default and name not in self.trackers:
                out.append(
                    f"perf.{name} is set but {name} is not in perf.trackers: it has NO effect"
                )
        return out
