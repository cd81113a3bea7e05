"""End to end: a hang in a pipeline's point-to-point operations: 4 ranks of the real
launcher (``rankguard run --standalone --preload torch``: forked from the fork server,
whose one import of torch serves them all), one pipeline stage each, the attribution
bench's job (``bench/attribution_job.py --model pipeline --p2p batch``, an unmodified
script: activations forward and gradients back by ``batch_isend_irecv``, as Megatron and
torch's pipelining schedules send them).

Stage 1 stalls in its forward at step 8: stage 0 waits for its gradients, stages 2 and 3
for its activations, each in a request's native ``Work.wait()`` under the script's own
frame, and torch 2.13's flight recorder has no entry for gloo's sends and receives. Stage
1 alone is named (``gpu_progress_timeout``), its hang ``point_to_point`` with stage 1
outside any wait; a flight-recorder verdict, where the finding carries one, names no
waiting stage. A healthy run of the same shape gets no finding."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

JOB = Path(__file__).resolve().parents[2] / "bench" / "attribution_job.py"
SETS = (
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=120",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
)
HANGS = ("gpu_progress_timeout", "rank_process_heartbeat_timeout", "rank_section_timeout")


def _findings(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "findings.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _launch(tmp_path: Path, run_id: str, job: list[str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "rankguard.cli.main", "run", "--standalone"]
    cmd += ["--nproc-per-node", "4", "--rdzv-id", run_id, "--log-dir", str(tmp_path)]
    cmd += ["--preload", "torch"]
    for item in SETS:
        cmd += ["--set", item]
    return subprocess.Popen(
        [*cmd, str(JOB), "--model", "pipeline", "--p2p", "batch", *job],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_the_stalled_stage_alone_is_named_not_the_stages_waiting_on_it(tmp_path: Path) -> None:
    run_id = "pipeline-forward"
    job = ["--seconds", "200", "--stall-rank", "1", "--stall-site", "forward"]
    proc = _launch(tmp_path, run_id, [*job, "--stall-step", "8"])
    run_dir = tmp_path / "heartbeat" / run_id
    first = None
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            hangs = [f for f in _findings(run_dir) if f.get("finding_type") in HANGS]
            if hangs and first is None:
                first = time.monotonic()
            if first is not None and time.monotonic() - first > 8:
                break
            time.sleep(0.5)
    finally:
        out = _stop(proc)
    hangs = [f for f in _findings(run_dir) if f.get("finding_type") in HANGS]
    assert hangs, out[-3000:]
    assert sorted({f["rank"] for f in hangs}) == [1], [f["message"] for f in hangs]
    assert {f["finding_type"] for f in hangs} == {"gpu_progress_timeout"}, hangs
    hang = hangs[0]["hang"]
    assert hang["kind"] == "point_to_point", hang
    assert (hang["missing_ranks"], hang["waiting_ranks"]) == ([1], [0, 2, 3]), hang
    fr = hangs[0].get("flight_recorder")
    if fr is not None:  # the traces' verdict, where the finding carries one
        assert set(fr["missing_ranks"]) <= {1}, fr


def test_a_healthy_pipeline_run_gets_no_finding(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "pipeline-healthy", ["--seconds", "8"])
    try:
        out, _ = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        out = _stop(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "[attribution] done" in out
    assert _findings(tmp_path / "heartbeat" / "pipeline-healthy") == []
