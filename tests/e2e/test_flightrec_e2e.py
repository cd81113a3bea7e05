"""End to end: a hang in a collective on gloo (a rank skips an all-reduce) under the real
launcher. With the defaults (fault tolerance off: nothing is killed) the hang's finding
names rank 1 and the collective from the ranks' flight recorder traces, and the
analyser's file it names exists; SIGINT then stops the job as SIGTERM does. On two
agents with fault tolerance on (node 0's finding names node 1's rank 3, the traces
taken before the kill): ``test_multinode_e2e.py``.

Why a real launch: the flight recorder's traces are dumped by each rank process of an
unmodified script on the launcher's request, and a signal to the launcher process acts
on its worker processes. How the traces are compared (who did not join which
collective) is tested on trace files in ``tests/unit/ft``."""

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
    no_leftover_workers,
    rankguard_cmd,
    read_jsonl,
    read_status,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


@pytest.mark.skipif(not available(), reason="this torch has no flight recorder")
def test_with_the_defaults_the_hang_names_the_collective_then_sigint_stops_the_job(
    tmp_path: Path, run_id: str
) -> None:
    """Fault tolerance off: the hang is reported, nothing is killed, and the finding
    still says who did not join which collective.

    The job is then stopped with SIGINT (Ctrl-C; Python's own default raises
    KeyboardInterrupt in the launcher): it stops as SIGTERM stops it
    (``test_run_files_e2e``): the workers get SIGTERM, the job ends stopped, and the
    exits the stop caused are no findings. SIGHUP and SIGQUIT go through the same
    handler the launcher installs for SIGTERM and SIGINT
    (``tests/unit/launcher/test_agent.py``: the workers' signal, a SIGHUP's shutdown).
    Why a real launch for it: a signal to the launcher process and what it does to its
    worker processes."""
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
            proc.send_signal(signal.SIGINT)
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

    # SIGINT stopped the job as SIGTERM does, without a false finding
    sig = signal.SIGINT
    assert proc.returncode == 128 + sig, out
    assert f"stopped by signal {int(sig)}" in out, out
    assert "closing signal SIGTERM" in out, out  # the workers get SIGTERM, not SIGINT
    assert "Traceback" not in out, out
    # the hang's finding alone: the exits the stop caused are none
    assert read_jsonl(run_dir / "findings.jsonl") == found, out
    status = read_status(run_dir)
    assert status["state"] == "stopped", out
    assert all(r["process_liveness"] == "exited" for r in status["ranks"]), status["ranks"]
    # the monitor was told why the ranks went away: the reason on each rank
    assert {(r["exit"] or {}).get("after_shutdown") for r in status["ranks"]} == {
        f"launcher received {sig.name}"
    }, status["ranks"]
    assert no_leftover_workers(run_id)
