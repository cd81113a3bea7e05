"""torchfrtrace, started at a hang's kill while the restarted workers import torch, runs
at the priority that leaves the cores to them (``SCHED_IDLE``), in its own process only."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rankguard.ft import flightrec

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes"),
]


def test_the_analyser_process_runs_at_idle_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the real runner's start, then what its analyser would run at: its class
    probe = "import os\nprint('policy', os.sched_getscheduler(0))\n"
    runner = flightrec._RUNNER
    head = runner[: runner.index("from torch.distributed.flight_recorder")]
    monkeypatch.setattr(flightrec, "_RUNNER", head + probe)
    out = flightrec._run_torchfrtrace(tmp_path, 30.0)
    assert out == f"policy {os.SCHED_IDLE}", out
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
