"""Features a config turns on that the script never took up (rerun, in-process
restart): said once by node 0's monitor, from the ranks' heartbeats."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest

from rankguard.monitor.unregistered import UnregisteredFeatures
from rankguard.schema.records import HeartbeatRecord
from tests.factories import heartbeat_record


@dataclass
class _State:
    raw: dict[str, Any]

    @property
    def record(self) -> HeartbeatRecord:
        return HeartbeatRecord.from_dict(self.raw)


def _ranks(seq: int, **blocks: Any) -> dict[int, _State]:
    return {r: _State(heartbeat_record(r, progress_seq=seq, **blocks)) for r in (0, 1)}


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_features_never_taken_up_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    ev = UnregisteredFeatures(("rerun", "inprocess"))
    with caplog.at_level(logging.WARNING, logger="rankguard.monitor.unregistered"):
        assert ev.evaluate(1.0, _ranks(1)) == []  # first step: too early to tell
        assert _said(caplog) == []
        ev.evaluate(2.0, _ranks(2))
        ev.evaluate(3.0, _ranks(5))
    said = _said(caplog)
    assert len(said) == 2
    assert said[0].startswith("rankguard: rerun_state_machine on, but the script never calls ")
    assert said[1].startswith("rankguard: inprocess_restart on, but the script is not wrapped")
    assert ev.status() == {"unused": ["rerun", "inprocess"]}


def test_features_taken_up_are_not_said(caplog: pytest.LogCaptureFixture) -> None:
    ev = UnregisteredFeatures(("rerun", "inprocess"))
    blocks = {"rerun": {"mode": "validate_results"}, "inprocess": {"restarts": 0}}
    with caplog.at_level(logging.WARNING, logger="rankguard.monitor.unregistered"):
        ev.evaluate(2.0, _ranks(3, **blocks))
    assert _said(caplog) == [] and ev.status() is None
    with pytest.raises(ValueError, match="unknown"):
        UnregisteredFeatures(("preempt",))
