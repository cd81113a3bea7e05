"""Where a rank's performance windows and run events go: the rank-side sink interface.

The perf reporter's thread (never the training thread) hands every log window, every
run event (a finding, a restart, a checkpoint commit) and, at the end, the summary to
the sinks it was given. A sink is anything that satisfies :class:`PerfSink`: the
``perf.jsonl`` file, the console line, TensorBoard, Weights & Biases, MLflow. The
default is :class:`NullSink`, so a run without sinks pays nothing.

:class:`SinkSet` fans out to several sinks and contains their failures: a sink that
raises is logged once (one warning line naming it), counted in
:attr:`SinkSet.errors`, and disabled after ``max_errors`` failures; the job never
crashes because a tracker could not write. A sink whose ``open`` fails (a tracker that
cannot start) is disabled at once: it has nothing to write into.

:class:`SinkThread` puts a thread of its own between the perf thread and the sinks: a
tracker that takes seconds to start (``wandb.init``) or to write (a remote MLflow
server) never delays the perf thread's windows, files and heartbeat fields. Its queue is
bounded; what does not fit is dropped and counted.

Adding a sink is one file: a class with ``name``, ``open``, ``window``, ``event`` and
``close`` (see ``docs/architecture.md``, "How to add a tracker").
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["NullSink", "PerfSink", "RunInfo", "SinkSet", "SinkThread"]

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
    ``restart``, ``checkpoint`` or ``goodput`` (node 0's latest ledger: ``ettr``,
    ``wall_s``, ``parts_s``, ``final``); ``step`` the training step it belongs to, if known;
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
                if (n >= self.max_errors or method == "open") and sink in self._sinks:
                    self._sinks.remove(sink)
                    self.disabled.append(name)
                    logger.warning("rankguard perf: sink %s disabled after %d failure(s)", name, n)

    def open(self, info: RunInfo) -> None:
        self._call("open", info)

    def window(self, entry: Mapping[str, Any]) -> None:
        self._call("window", entry)

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        self._call("event", kind, step, fields)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self._call("close", summary)


_STOP = object()


class SinkThread:
    """Calls a :class:`PerfSink` from a thread of its own, fed through a bounded queue.

    ``open``/``window``/``event`` only enqueue (never block; a full queue drops the
    call and counts it in :attr:`dropped`); ``close`` enqueues the summary and waits
    up to ``close_timeout_s`` for the sinks to finish (a warning if they do not).
    """

    def __init__(
        self,
        sink: PerfSink,
        *,
        maxsize: int = 10_000,
        close_timeout_s: float = 60.0,
        name: str = "rankguard-trackers",
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize: must be >= 1, got {maxsize}")
        if close_timeout_s <= 0:
            raise ValueError(f"close_timeout_s: must be > 0, got {close_timeout_s}")
        self.sink = sink
        self.name = getattr(sink, "name", "sinks")
        self.close_timeout_s = close_timeout_s
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._closed = False

    def _put(self, item: Any) -> None:
        if self._closed:
            return
        if not self._started:
            self._started = True
            self._thread.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            method, args = item
            try:
                getattr(self.sink, method)(*args)
            except Exception:  # a SinkSet contains its sinks' errors; anything else here
                logger.exception("rankguard perf: %s failed in %s", self.name, method)

    def open(self, info: RunInfo) -> None:
        self._put(("open", (info,)))

    def window(self, entry: Mapping[str, Any]) -> None:
        self._put(("window", (entry,)))

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        self._put(("event", (kind, step, fields)))

    def close(self, summary: Mapping[str, Any] | None) -> bool:
        """Close the sinks on their thread; True when they finished in time."""
        if self._closed:
            return True
        if not self._started:
            self._closed = True
            return True
        self._queue.put(("close", (summary,)))  # blocking: close is never dropped
        self._queue.put(_STOP)
        self._closed = True
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "rankguard perf: %s did not finish within %.0f s; what they had not written "
                "yet is lost",
                self.name,
                self.close_timeout_s,
            )
            return False
        if self.dropped:
            logger.warning(
                "rankguard perf: %d window(s)/event(s) dropped: %s could not keep up",
                self.dropped,
                self.name,
            )
        return True
