"""Weights & Biases: the script's own run if it has one, else a run of rankguard's.

A script that called ``wandb.init`` before the first perf window gets rankguard's
figures in that run under ``rankguard/`` (``rankguard/perf/step_time_ms``), plotted
against ``rankguard/step`` (declared with ``define_metric``, so W&B's own step counter
and the script's ``log`` calls are untouched), and the run stays the script's to
finish. Otherwise rankguard opens a run (``perf.wandb``: project, entity, name, group,
dir, mode; name and group default to the run id) and finishes it at close. Imported
only when configured (``pip install 'rankguard[wandb]'``); ``WANDB_MODE=offline`` works
as with any W&B run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankguard.perf.config import WandbConfig
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

__all__ = ["PACKAGE", "WandbSink"]

PACKAGE = "wandb"


class WandbSink:
    name = "wandb"

    def __init__(self, cfg: WandbConfig, *, per_rank: bool = False) -> None:
        self.cfg = cfg
        self.per_rank = per_rank
        self.run: Any = None
        self.attached = False
        self.prefix = ""
        self._events = EventCounter()
        self._goodput: dict[str, float] = {}
        self._last_step = 0

    def open(self, info: RunInfo) -> None:
        import wandb

        if wandb.run is not None:  # the script's run: log into it, leave it open
            self.run, self.attached, self.prefix = wandb.run, True, ATTACHED_PREFIX
        else:
            cfg = self.cfg
            name = cfg.name or info.run_id
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                name=f"{name}-rank{info.rank}" if self.per_rank else name,
                group=cfg.group or (info.run_id if self.per_rank else None),
                dir=cfg.dir,
                mode=cfg.mode,  # type: ignore[arg-type]  # validated in WandbConfig
                config={
                    "rankguard": {
                        "run_id": info.run_id,
                        "rank": info.rank,
                        "world_size": info.world_size,
                        **dict(info.config),
                    }
                },
            )
        p = self.prefix
        self.run.define_metric(f"{p}step")
        for group in ("perf", "events", "summary", "goodput"):
            self.run.define_metric(f"{p}{group}/*", step_metric=f"{p}step")

    def window(self, entry: Mapping[str, Any]) -> None:
        step = window_step(entry)
        self._last_step = max(self._last_step, step)
        self.run.log({f"{self.prefix}step": step, **scalars(entry, self.prefix)})

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        p = self.prefix
        if kind == GOODPUT:  # the latest ledger, also the run's summary at the end
            self._goodput = goodput_scalars(fields, p)
            at = self._last_step if step is None else step
            self.run.log({f"{p}step": at, **self._goodput})
            return
        tag, count = self._events.add(kind)
        self.run.log(
            {
                f"{p}step": self._last_step if step is None else step,
                f"{p}{tag}": count,
                f"{p}events/last_{kind}": event_line(kind, fields),
            }
        )

    def close(self, summary: Mapping[str, Any] | None) -> None:
        if self.run is None:
            return
        final = {**self._goodput, **summary_scalars(summary, self.prefix)}
        if final:
            self.run.summary.update(final)
        if not self.attached:
            self.run.finish()
        self.run = None
