"""The end-to-end tests' helper that starts one launcher per node (``run_nodes`` in
tests/e2e/conftest.py): what it leaves behind when a node does not end in time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rankguard.util.procs import pid_running
from tests.e2e.conftest import outliving, run_nodes

# writes its pid (the shell's, kept by exec), then outlives any test
SLEEPER = 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 120'


def _pids(files: list[Path], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not all(f.exists() for f in files):
        assert time.monotonic() < deadline, [f.exists() for f in files]
        time.sleep(0.05)
    return [int(f.read_text()) for f in files]


def test_a_node_past_its_timeout_leaves_no_node_running(tmp_path: Path) -> None:
    """Node 0 does not end in time: the test fails with the timeout, and node 1 is
    ended too, not left running (an orphaned launcher of a failed test used to train on
    beside the rest of the suite)."""
    files = [tmp_path / f"node{n}.pid" for n in (0, 1)]
    cmds = {n: ["/bin/sh", "-c", SLEEPER, str(files[n])] for n in (0, 1)}
    with pytest.raises(subprocess.TimeoutExpired):
        run_nodes(cmds, timeout_s=1.0)
    pids = _pids(files, timeout_s=10.0)
    try:
        assert outliving(pids, within_s=5.0) == []
    finally:
        for pid in pids:
            if pid_running(pid):
                os.kill(pid, signal.SIGKILL)
