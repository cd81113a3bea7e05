"""Where a rank's performance windows and run events go: the rank-side sink interface.

The perf reporter's thread (never the training thread) hands every log window, every
run event (a finding, a restart, a checkpoint commit) and, at the end, the summary to
the sinks it was given. A sink is anything that satisfies :class:`PerfSink`: the
``perf.jsonl`` file, the console line, TensorBoard, Weights & Biases, MLflow. The
default is :class:`NullSink`, so a run without sinks pays nothing.

:class:`SinkSet` fans out to several sinks and contains their failures: a sink that
raises is logged once (one warning line naming it), counted in
:attr:`SinkSet.errors`, and disabled after ``max_errors`` failures; the job never
crashes because a tracker could not write.

Adding a sink is one file: a class with ``name``, ``open``, ``window``, ``event`` and
``close`` (see ``docs/architecture.md``, "How to add a tracker").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["NullSink", "PerfSink", "RunInfo", "SinkSet"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a sink knows about the run when it opens."""

    run_id: str
    rank: int
    world_size: int
    out_dir: str | None = None  # the rank's perf directory (None: not rank 0)
    job: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)  # flat facts worth logging once


@runtime_checkable
class PerfSink(Protocol):
    """A destination for perf windows and run events. Called from the perf thread only.

    ``window`` receives one perf window as written to ``perf.jsonl`` (keys
    ``iteration``, ``step``, ``step_time_ms``, ``tokens_per_sec``, ``samples_per_sec``,
    ``TFLOPS_per_GPU``, ``TFLOPS_total``, ``MFU``, ``memory_GB``, ``peak_memory_GB``, ...;
    a value may be None). ``event`` receives a run event: ``kind`` is ``finding``,
    ``restart`` or ``checkpoint``; ``step`` the training step it belongs to, if known;
    ``fields`` its JSON-ready content. ``close`` receives the run summary (FlagScale's
    perf summary schema) or None.
    """

    name: str

    def open(self, info: RunInfo) -> None: ...

    def window(self, entry: Mapping[str, Any]) -> None: ...

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None: ...

    def close(self, summary: Mapping[str, Any] | None) -> None: ...


class NullSink:
    """The default: accepts everything, does nothing."""

    name = "null"

    def open(self, info: RunInfo) -> None:
        return None

    def window(self, entry: Mapping[str, Any]) -> None:
        return None

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        return None

    def close(self, summary: Mapping[str, Any] | None) -> None:
        return None


class SinkSet:
    """Several sinks behind one :class:`PerfSink`; a failing sink never reaches the
    caller: it is logged once, counted, and dropped after ``max_errors`` failures."""

    name = "sinks"

    def __init__(self, sinks: Iterable[PerfSink] = (), *, max_errors: int = 100) -> None:
        if max_errors < 1:
            raise ValueError(f"max_errors: must be >= 1, got {max_errors}")
        self._sinks: list[PerfSink] = [s for s in sinks if not isinstance(s, NullSink)]
        self.max_errors = max_errors
        self.errors: dict[str, int] = {}
        self.disabled: list[str] = []

    @property
    def sinks(self) -> tuple[PerfSink, ...]:
        return tuple(self._sinks)

    def add(self, sink: PerfSink) -> None:
        if not isinstance(sink, NullSink):
            self._sinks.append(sink)

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def _call(self, method: str, *args: Any) -> None:
        for sink in list(self._sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:
                name = getattr(sink, "name", type(sink).__name__)
                n = self.errors.get(name, 0) + 1
                self.errors[name] = n
                if n == 1:
                    logger.warning(
                        "rankguard perf: sink %s failed in %s (%s: %s); "
                        "the job goes on, further failures are only counted",
                        name,
                        method,
                        type(exc).__name__,
                        exc,
                    )
                if n >= self.max_errors and sink in self._sinks:
                    self._sinks.remove(sink)
                    self.disabled.append(name)
                    logger.warning("rankguard perf: sink %s disabled after %d failures", name, n)

    def open(self, info: RunInfo) -> None:
        self._call("open", info)

    def window(self, entry: Mapping[str, Any]) -> None:
        self._call("window", entry)

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        self._call("event", kind, step, fields)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self._call("close", summary)
