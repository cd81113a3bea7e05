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


def _autogroup_nice(pid: str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as fh:
            return int(fh.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.skipif(_autogroup_nice() is None, reason="no autogroup scheduling here")
def test_the_analyser_leads_a_session_whose_autogroup_is_at_nice_19(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SCHED_IDLE yields only within its autogroup (one per session): the restarted
    # workers lead sessions of their own, so the analyser's group must yield as a whole
    before = _autogroup_nice()
    probe = (
        "import os\n"
        "print('leader', os.getsid(0) == os.getpid())\n"
        "print('group', open('/proc/self/autogroup').read().split()[-1])\n"
    )
    runner = flightrec._RUNNER
    head = runner[: runner.index("from torch.distributed.flight_recorder")]
    monkeypatch.setattr(flightrec, "_RUNNER", head + probe)
    out = flightrec._run_torchfrtrace(tmp_path, 30.0)
    assert out.splitlines() == ["leader True", "group 19"], out
    assert _autogroup_nice() == before  # this process's group keeps its share


def _trace(config: dict[str, object]) -> dict[str, object]:
    entry = {"process_group": ["0", "default_pg"], "collective_seq_id": 1, "is_p2p": False}
    return {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": [entry]}


def test_traces_torch_cannot_match_start_no_analyser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gloo's traces describe no group: torchfrtrace stops on the first entry with a
    # KeyError, after a torch import that costs the restarted workers a core's second
    started: list[Path] = []
    monkeypatch.setattr(flightrec, "_run_torchfrtrace", lambda d, t: started.append(d) or "ran")
    gloo = {0: _trace({}), 1: _trace({})}
    out = flightrec._torch_analysis(gloo, tmp_path, 30.0)
    assert not started
    assert out.startswith("torchfrtrace not run: rank 0's trace names process group '0'"), out
    described = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    nccl = {0: _trace(described), 1: _trace(described)}
    assert flightrec._torch_analysis(nccl, tmp_path, 30.0) == "ran"
    assert len(started) == 1
    partly = {0: _trace(described), 1: _trace({})}  # one rank's group undescribed
    assert flightrec.undescribed_group(partly) == (1, "0")
