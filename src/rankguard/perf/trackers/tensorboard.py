"""TensorBoard: event files written with ``torch.utils.tensorboard.SummaryWriter``.

Scalars ``perf/<key>`` at each window's iteration, ``events/<kind>s`` counts and
``events/<kind>`` text for findings, restarts and checkpoints, the run's facts as text
at the first write and the final statistics (``summary/<key>``) at close. The writer's
own thread flushes every ``flush_secs``; ``add_scalar`` only queues. Imported only when
configured (``pip install 'rankguard[tensorboard]'``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankguard.perf.config import TensorBoardConfig
from rankguard.perf.sinks import RunInfo
from rankguard.perf.trackers.common import (
    GOODPUT,
    EventCounter,
    event_line,
    goodput_scalars,
    scalars,
    summary_scalars,
    window_step,
)

__all__ = ["PACKAGE", "TensorBoardSink"]

PACKAGE = "tensorboard"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(
        self, cfg: TensorBoardConfig, *, default_dir: Path | None, per_rank: bool = False
    ) -> None:
        self.cfg = cfg
        self.default_dir = default_dir
        self.per_rank = per_rank
        self.log_dir: Path | None = None
        self._writer: Any = None
        self._events = EventCounter()
        self._last_step = 0

    def open(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        base = Path(self.cfg.log_dir) if self.cfg.log_dir else self.default_dir
        if base is None:
            raise ValueError("perf.tensorboard.log_dir: no directory (set it)")
        self.log_dir = base / f"rank_{info.rank}" if self.per_rank else base
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.cfg.flush_secs)
        facts = {"run_id": info.run_id, "rank": info.rank, "world_size": info.world_size}
        facts.update({k: v for k, v in info.config.items()})
        self._writer.add_text("rankguard/run", json.dumps(facts, default=str), 0)

    def window(self, entry: Mapping[str, Any]) -> None:
        step = window_step(entry)
        self._last_step = max(self._last_step, step)
        for tag, value in scalars(entry).items():
            self._writer.add_scalar(tag, value, step)

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        at = self._last_step if step is None else step
        if kind == GOODPUT:
            for tag, value in goodput_scalars(fields).items():
                self._writer.add_scalar(tag, value, at)
            return
        tag, count = self._events.add(kind)
        self._writer.add_scalar(tag, count, at)
        self._writer.add_text(f"events/{kind}", event_line(kind, fields), at)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        if self._writer is None:
            return
        for tag, value in summary_scalars(summary).items():
            self._writer.add_scalar(tag, value, self._last_step)
        self._writer.close()
        self._writer = None
