"""MLflow: the script's active run if it has one, else a run of rankguard's.

Everything goes through ``MlflowClient`` with an explicit run id (the perf thread is not
the thread that started the script's run, and MLflow's active run is per thread). The
script's run is the one active on its main thread, or the ``MLFLOW_RUN_ID`` it was
started with; rankguard then logs under ``rankguard/`` and leaves the run to the script.
Otherwise it opens a run (``perf.mlflow``: tracking URI, experiment, run name; the name
defaults to the run id) and ends it at close. Findings, restarts and checkpoints are
counts (``events/<kind>s``) plus, at close, ``rankguard/events.json`` and the summary
as artifacts. Imported only when configured (``pip install 'rankguard[mlflow]'``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from rankguard.perf.config import MlflowConfig
from rankguard.perf.sinks import RunInfo
from rankguard.perf.trackers.common import (
    ATTACHED_PREFIX,
    GOODPUT,
    EventCounter,
    event_line,
    goodput_scalars,
    scalars,
    summary_scalars,
    window_step,
)
from rankguard.schema.jsontypes import JsonObject

__all__ = ["PACKAGE", "MlflowSink", "script_run_id"]

PACKAGE = "mlflow"
_MAX_EVENTS = 10_000  # kept for the events artifact


def script_run_id() -> str | None:
    """The run the training script has open: active in this thread or on the main
    thread (MLflow keeps one stack per thread), or given by ``MLFLOW_RUN_ID``."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        try:  # MLflow's per-thread stacks: the main thread's top run
            from mlflow.tracking import fluent

            stacks = fluent._active_run_stack.get_all_thread_values()
            stack = stacks.get(threading.main_thread().ident or 0) or []
            run = stack[-1] if stack else None
        except Exception:  # another MLflow layout: only the documented ways remain
            run = None
    if run is not None:
        return str(run.info.run_id)
    return os.environ.get("MLFLOW_RUN_ID") or None


class MlflowSink:
    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, *, per_rank: bool = False) -> None:
        self.cfg = cfg
        self.per_rank = per_rank
        self.client: Any = None
        self.run_id: str | None = None
        self.attached = False
        self.prefix = ""
        self._events = EventCounter()
        self._lines: list[JsonObject] = []
        self._last_step = 0

    def open(self, info: RunInfo) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        cfg = self.cfg
        attached = script_run_id()
        if attached is not None:
            self.client = MlflowClient(tracking_uri=cfg.tracking_uri or mlflow.get_tracking_uri())
            self.run_id, self.attached, self.prefix = attached, True, ATTACHED_PREFIX
            return
        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        name = cfg.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self.client.create_experiment(name)
            except Exception:  # another rank created it first
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        run_name = cfg.run_name or info.run_id
        run = self.client.create_run(
            experiment_id,
            run_name=f"{run_name}-rank{info.rank}" if self.per_rank else run_name,
            tags={"rankguard.run_id": info.run_id, "rankguard.rank": str(info.rank)},
        )
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = {"world_size": info.world_size, **dict(info.config)}
        self.client.log_batch(
            self.run_id, params=[Param(f"rankguard.{k}", str(v)[:500]) for k, v in params.items()]
        )

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()]
        )

    def window(self, entry: Mapping[str, Any]) -> None:
        step = window_step(entry)
        self._last_step = max(self._last_step, step)
        values = scalars(entry, self.prefix)
        if values:
            self._metrics(values, step)

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        at = self._last_step if step is None else step
        if kind == GOODPUT:
            values = goodput_scalars(fields, self.prefix)
            if values:
                self._metrics(values, at)
            return
        tag, count = self._events.add(kind)
        self._metrics({f"{self.prefix}{tag}": float(count)}, at)
        if len(self._lines) < _MAX_EVENTS:
            self._lines.append({"kind": kind, "step": at, "text": event_line(kind, fields)})

    def close(self, summary: Mapping[str, Any] | None) -> None:
        if self.run_id is None:
            return
        final = summary_scalars(summary, self.prefix)
        if final:
            self._metrics(final, self._last_step)
        if self._lines:
            self.client.log_dict(self.run_id, self._lines, f"{ATTACHED_PREFIX}events.json")
        if summary:
            self.client.log_dict(self.run_id, dict(summary), f"{ATTACHED_PREFIX}perf_summary.json")
        if not self.attached:
            self.client.set_terminated(self.run_id)
        self.run_id = None
