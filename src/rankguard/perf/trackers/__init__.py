"""Trackers: TensorBoard, Weights & Biases and MLflow as perf sinks (``perf.trackers``).

Each tracker is one module with its framework imported inside its ``open`` (a job
without trackers imports none of them). :func:`build_trackers` turns the config into
sinks for the perf reporter: on rank 0 only unless ``perf.tracker_ranks: all``; a
tracker whose package is not installed is one warning line and no sink (the job goes
on). The reporter's thread opens them at the first window, so a script that started
its own W&B or MLflow run by then has rankguard's figures logged into it.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from rankguard.perf.config import PerfConfig
from rankguard.perf.sinks import PerfSink

__all__ = ["EXTRAS", "build_trackers", "installed"]

logger = logging.getLogger(__name__)

#: tracker -> (import name of its package, the rankguard extra that installs it)
EXTRAS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def build_trackers(cfg: PerfConfig, *, rank: int, perf_dir: Path | None) -> list[PerfSink]:
    """The sinks ``cfg.trackers`` asks of this rank (none on ranks other than 0 unless
    ``tracker_ranks: all``). ``perf_dir``: the run's perf directory (TensorBoard's
    default home)."""
    per_rank = cfg.tracker_ranks == "all"
    if not cfg.trackers or (rank != 0 and not per_rank):
        return []
    sinks: list[PerfSink] = []
    for name in cfg.trackers:
        package, extra = EXTRAS[name]
        if not installed(package):
            logger.warning(
                "rankguard perf: perf.trackers has %s but the %s package is not installed "
                "(pip install 'rankguard[%s]'): NOTHING goes to %s; the job goes on",
                name,
                package,
                extra,
                name,
            )
            continue
        if name == "tensorboard":
            from rankguard.perf.trackers.tensorboard import TensorBoardSink

            default = perf_dir / "tensorboard" if perf_dir is not None else None
            sinks.append(TensorBoardSink(cfg.tensorboard, default_dir=default, per_rank=per_rank))
        elif name == "wandb":
            from rankguard.perf.trackers.wandb import WandbSink

            sinks.append(WandbSink(cfg.wandb, per_rank=per_rank))
        else:
            from rankguard.perf.trackers.mlflow import MlflowSink

            sinks.append(MlflowSink(cfg.mlflow, per_rank=per_rank))
    return sinks
