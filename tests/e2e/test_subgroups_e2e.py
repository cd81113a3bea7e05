"""End to end: hangs in process groups other than the default: 4 ranks of the real launcher
(``rankguard run --standalone --preload torch``: forked from the fork server, whose one
import of torch serves them all; start-up is not the subject) on a 2x2 mesh
(``init_device_mesh("cpu", (2, 2))``: data-parallel x tensor-parallel groups of 2), the
attribution bench's job
(``bench/attribution_job.py --model mesh``, an unmodified script).

The groups' names, the same on every rank: ``0`` the world, ``1`` = data-parallel {0, 2},
``2`` = {1, 3}, ``3`` = tensor-parallel {0, 1}, ``4`` = {2, 3}. Rank 3 stalls:

- in ``forward``, before its tensor-parallel all-reduce: rank 2 waits in it, ranks 0 and
  1 complete theirs and wait in their data-parallel all-reduce (rank 0 for rank 2, rank 1
  for rank 3);
- in ``backward``, before its data-parallel all-reduce: rank 1 waits in it, ranks 0 and
  2 complete theirs and go on to the next step.

Either way rank 3 alone is named (``gpu_progress_timeout``), its hang ``did_not_join``
with a group rank 3 belongs to and the collective's number there (the group it stalled
before among those its hang lists), and so does the flight recorder's verdict where the
finding carries one; a healthy run of the same shape gets no
finding. Why forked ranks: the sampler reads each process's own flight recorder (ranks
as threads share one)."""

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

from rankguard.ft.flightrec import available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not available(), reason="this torch has no flight recorder"),
]

JOB = Path(__file__).resolve().parents[2] / "bench" / "attribution_job.py"
SETS = (
    "heartbeat.enabled=true",
    "heartbeat.publish_interval_s=0.5",
    "heartbeat.scan_interval_s=0.5",
    "heartbeat.initial_process_timeout_s=60",
    "heartbeat.process_timeout_s=3",
    "heartbeat.progress_timeout_s=4",
)
HANGS = ("gpu_progress_timeout", "rank_process_heartbeat_timeout", "rank_section_timeout")
RANK3_GROUPS = {"0", "2", "4"}  # the world, its data-parallel and tensor-parallel groups
#: the group of the collective rank 3 stalled before: one its hang says it did not join
SKIPPED = {"forward": "4", "backward": "2"}


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
        [*cmd, str(JOB), "--model", "mesh", *job],
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


def _stalled_run(tmp_path: Path, site: str) -> tuple[list[dict[str, Any]], str]:
    """Rank 3 stalls in ``site`` at step 8; the run is stopped 8 s after the first hang
    finding: the hang findings by then, and the launcher's output."""
    run_id = f"mesh-{site}"
    job = ["--seconds", "200", "--stall-rank", "3", "--stall-site", site, "--stall-step", "8"]
    proc = _launch(tmp_path, run_id, job)
    run_dir = tmp_path / "heartbeat" / run_id
    first = None
    deadline = time.monotonic() + 180
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
    return [f for f in _findings(run_dir) if f.get("finding_type") in HANGS], out


@pytest.mark.parametrize("site", ["forward", "backward"])
def test_the_stalled_rank_of_a_mesh_alone_is_named_with_its_group(
    tmp_path: Path, site: str
) -> None:
    hangs, out = _stalled_run(tmp_path, site)
    assert hangs, out[-3000:]
    assert sorted({f["rank"] for f in hangs}) == [3], [f["message"] for f in hangs]
    assert {f["finding_type"] for f in hangs} == {"gpu_progress_timeout"}, hangs
    hang = hangs[0]["hang"]
    assert hang["kind"] == "did_not_join" and hang["missing_ranks"] == [3], hang
    assert hang["group"] in RANK3_GROUPS and hang["seq"] >= 1, hang
    said = {hang["group"], *(g["group"] for g in hang["also"])}
    assert SKIPPED[site] in said and said <= RANK3_GROUPS, hang
    fr = hangs[0].get("flight_recorder")
    if fr is not None:  # the traces' verdict, where the finding carries one
        assert fr["missing_ranks"] == [3] and fr["process_group"] in RANK3_GROUPS, fr


def test_a_healthy_mesh_run_gets_no_finding(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "mesh-healthy", ["--seconds", "8"])
    try:
        out, _ = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        out = _stop(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "[attribution] done" in out
    assert _findings(tmp_path / "heartbeat" / "mesh-healthy") == []
