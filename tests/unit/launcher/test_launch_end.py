"""Node 0's launcher records the job's end (``ended_unix_s``) in its launcher file once
the agent's run is over, before the final status: the goodput ledger's wall time then
includes the ranks' exit after their last record."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rankguard.launcher import run as run_mod


def _launcher_file(run_dir: Path, pid: int) -> Path:
    path = run_dir / "launcher_node_0.json"
    path.write_text(json.dumps({"run_id": "r", "pid": pid, "started_unix_s": 1.0}))
    return path


def test_the_launchers_own_file_gains_its_end(tmp_path: Path) -> None:
    path = _launcher_file(tmp_path, os.getpid())
    before = time.time()
    run_mod._mark_launch_end(tmp_path)
    obj = json.loads(path.read_text())
    assert before - 0.01 <= obj["ended_unix_s"] <= time.time() + 0.01
    assert obj["started_unix_s"] == 1.0 and obj["run_id"] == "r"  # the rest kept


def test_another_launchers_file_or_none_is_left_alone(tmp_path: Path) -> None:
    path = _launcher_file(tmp_path, os.getpid() + 1)  # a job retry's launcher rewrote it
    run_mod._mark_launch_end(tmp_path)
    assert "ended_unix_s" not in json.loads(path.read_text())
    path.write_text("{torn")
    run_mod._mark_launch_end(tmp_path)
    assert path.read_text() == "{torn"
    run_mod._mark_launch_end(tmp_path / "missing")  # no file: nothing, no error
