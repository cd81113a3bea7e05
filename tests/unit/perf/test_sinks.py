"""The rank-side perf sink interface: null default, fan-out, failures contained."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from rankguard.perf.sinks import NullSink, PerfSink, RunInfo, SinkSet


class _Recorder:
    name = "rec"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def open(self, info: RunInfo) -> None:
        self.calls.append(("open", info.run_id))

    def window(self, entry: Mapping[str, Any]) -> None:
        self.calls.append(("window", entry["step"]))

    def event(self, kind: str, step: int | None, fields: Mapping[str, Any]) -> None:
        self.calls.append(("event", (kind, step)))

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self.calls.append(("close", summary is not None))


class _Broken(_Recorder):
    name = "broken"

    def window(self, entry: Mapping[str, Any]) -> None:
        raise RuntimeError("tracker down")


def test_null_sink_and_recorder_satisfy_the_protocol() -> None:
    assert isinstance(NullSink(), PerfSink)
    assert isinstance(_Recorder(), PerfSink)
    assert isinstance(SinkSet(), PerfSink)


def test_sinkset_fans_out_in_order() -> None:
    a, b = _Recorder(), _Recorder()
    sinks = SinkSet([a, NullSink(), b])
    assert len(sinks.sinks) == 2  # the null object is dropped
    sinks.open(RunInfo(run_id="r", rank=0, world_size=2))
    sinks.window({"step": 1})
    sinks.event("restart", 7, {"cause": "x"})
    sinks.close({})
    want = [("open", "r"), ("window", 1), ("event", ("restart", 7)), ("close", True)]
    assert a.calls == want and b.calls == want


def test_failing_sink_is_warned_once_counted_then_disabled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good, bad = _Recorder(), _Broken()
    sinks = SinkSet([bad, good], max_errors=3)
    with caplog.at_level(logging.WARNING, logger="rankguard.perf.sinks"):
        for step in range(5):
            sinks.window({"step": step})
    assert [c for c in good.calls if c[0] == "window"] == [("window", s) for s in range(5)]
    assert sinks.errors == {"broken": 3}
    assert sinks.disabled == ["broken"]
    failed = [r for r in caplog.records if "failed in window" in r.getMessage()]
    assert len(failed) == 1
    assert any("disabled after 3" in r.getMessage() for r in caplog.records)


def test_empty_sinkset_is_false_and_bad_bound_refused() -> None:
    assert not SinkSet()
    with pytest.raises(ValueError, match="max_errors"):
        SinkSet(max_errors=0)
