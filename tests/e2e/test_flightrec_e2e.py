"""End to end: a hang in a collective on gloo (a rank skips an all-reduce) under the real
launcher. With the defaults (fault tolerance off: nothing is killed) the hang's finding
names rank 1 and the collective from the ranks' flight recorder traces, and the
analyser's file it names exists; on two agents with fault tolerance on, node 0's
finding names node 1's rank 3 and the traces were taken before the kill.

Why real launches: the flight recorder's traces are dumped by each rank process of an
unmodified script on the launcher's request, and a hang across agents is read on node
0. How the traces are compared (who did not join which collective) is tested on trace
files in ``tests/unit/ft``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rankguard.ft.flightrec import available

from .conftest import (
    SCRIPTS,
    free_port,
    node_run,
    rankguard_cmd,
    read_jsonl,
    run_nodes,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


@pytest.mark.skipif(not available(), reason="this torch has no flight recorder")
def test_with_the_defaults_the_hang_names_the_collective(tmp_path: Path, run_id: str) -> None:
    """Fault tolerance off: the hang is reported, nothing is killed, and the finding
    still says who did not join which collective (the job is then stopped here)."""
    proc = subprocess.Popen(
        rankguard_cmd(*standalone_run(run_id, tmp_path), str(SCRIPTS / "skip_allreduce.py")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run_dir = tmp_path / "heartbeat" / run_id
    found: list[dict] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            path = run_dir / "findings.jsonl"
            found = (
                [f for f in read_jsonl(path) if f.get("flight_recorder")] if path.exists() else []
            )
            if found:
                break
            time.sleep(0.5)
    finally:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert found, out
    fr = found[0]["flight_recorder"]
    assert fr["missing_ranks"] == [1] and fr["waiting_ranks"] == [0], fr
    assert fr["collective"] == "all_reduce" and fr["seq"] >= 6, fr
    assert "rank(s) 1 did not join all_reduce" in found[0]["message"]
    assert found[0].get("action") in (None, "report"), found[0]  # nothing was killed
    # the ranks' traces and torchfrtrace's output, where the finding says
    named = Path(fr["torch_analysis"])
    assert named.parent == run_dir / "flightrec", fr
    assert named.read_text().startswith("torchfrtrace"), named.read_text()
    assert "running over" not in named.read_text()  # finished (or said it did not)
    assert (run_dir / "flightrec" / "rank_0.json").exists()
    assert (run_dir / "flightrec" / "rank_1.json").exists()


@pytest.mark.skipif(not available(), reason="this torch has no flight recorder")
def test_a_node_1_rank_that_skipped_an_all_reduce_is_named_on_node_0(
    tmp_path: Path, run_id: str
) -> None:
    """Two agents on loopback, two ranks each: rank 3 (node 1's second rank) skips an
    all-reduce. Node 0's finding names rank 3 (the job's number, not its local 1), the
    collective and its sequence number, from every node's heartbeats; nothing else is
    named."""
    port = free_port()
    logs = {n: tmp_path / f"node{n}" for n in (0, 1)}
    cmds = {
        node: rankguard_cmd(
            *node_run(node, port, run_id, logs[node]),
            "--set",
            "fault_tolerance.enable_ft_package=true",
            "--set",
            "fault_tolerance.num_in_job_restarts=0",
            "--set",
            "fault_tolerance.termination_grace_s=3",
            "--set",
            "fault_tolerance.stack_dump=faulthandler",
            str(SCRIPTS / "skip_allreduce.py"),
            "--skip-rank",
            "3",
        )
        for node in (0, 1)
    }
    outs, codes = run_nodes(cmds, timeout_s=120)
    both = "\n".join(f"--- node {n}\n{o}" for n, o in outs.items())
    assert codes[0] != 0, both
    found = read_jsonl(logs[0] / "heartbeat" / run_id / "findings.jsonl")
    hangs = [f for f in found if f.get("hang")]
    assert [(f["rank"], f["finding_type"]) for f in hangs] == [(3, "gpu_progress_timeout")], both
    hang = hangs[0]["hang"]
    assert hang["kind"] == "did_not_join" and hang["missing_ranks"] == [3], hang
    assert hang["waiting_ranks"] == [0, 1, 2] and hang["op"] == "all_reduce", hang
    assert hang["seq"] >= 6, hang
    assert f"rank(s) 3 did not join all_reduce #{hang['seq']}" in hangs[0]["message"]
    # fault tolerance on: node 0's ranks' traces were taken before the kill
    traces = logs[0] / "heartbeat" / run_id / "flightrec"
    assert (traces / "rank_0.json").exists() and (traces / "rank_1.json").exists(), both
