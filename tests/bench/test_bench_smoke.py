"""Every bench script runs: ``python bench/<name>.py --smoke`` (tiny sizes, seconds) exits
0 with no traceback, so a figure in bench/README.md cannot silently stop being
reproducible. A new bench script is picked up by itself and must have ``--smoke``; job
scripts that another bench starts (``JOBS``) run inside that bench's smoke run, which must
show it (``JOB_EVIDENCE``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.timeout(240)]

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Scripts started by another bench (not benches themselves): the parent's smoke runs them,
# and its output says so (JOB_EVIDENCE: a line only a run of that job script prints).
JOBS = {
    "fault_matrix_collective.py": "fault_matrix.py",
    "fault_matrix_launcher.py": "fault_matrix.py",
    "inprocess_job.py": "inprocess.py",
    "goodput_job.py": "goodput.py",
    "live_recovery_job.py": "live_recovery.py",
}
JOB_EVIDENCE = {
    "fault_matrix_collective.py": "collective_hang",  # its case's row in the table
    "fault_matrix_launcher.py": "monitor_crash/once",
    "inprocess_job.py": "rankguard fault -> first step after re-entry",
    "goodput_job.py": "faults fired: exception",
    "live_recovery_job.py": "uninterrupted run (torchrun): exit 0",
}
# Benches that write simulated ranks' records themselves (no real rank, no fault injected).
SIMULATES_RANKS = {"scale.py", "monitor_scan.py"}
# Benches whose smoke run has a test of its own that asserts more of its output.
OWN_TEST = {
    "checkpoint.py": "test_checkpoint_bench.py",
    "goodput.py": "test_goodput_bench.py",
    "live_recovery.py": "test_live_recovery_bench.py",
    "soak.py": "test_live_recovery_bench.py",
}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in JOBS)


def _has_smoke(name: str) -> bool:
    return '"--smoke"' in (BENCH / name).read_text(encoding="utf-8")


def test_every_job_script_is_started_by_its_bench() -> None:
    assert set(JOB_EVIDENCE) == set(JOBS)
    for job, parent in JOBS.items():
        assert (BENCH / job).is_file(), job
        assert job in (BENCH / parent).read_text(encoding="utf-8"), (job, parent)


def test_a_bench_left_to_its_own_test_has_one_that_runs_its_smoke_mode() -> None:
    for name, test in OWN_TEST.items():
        text = (Path(__file__).parent / test).read_text(encoding="utf-8")
        assert name in text and '"--smoke"' in text, (name, test)


def test_the_benches_are_found() -> None:
    assert {"hot_path.py", "monitor_scan.py", "gpu_check.py"} <= set(SCRIPTS), SCRIPTS


def test_every_bench_has_a_smoke_mode() -> None:
    missing = [name for name in SCRIPTS if not _has_smoke(name)]
    assert not missing, f"every bench script needs a --smoke mode: {missing}"


@pytest.mark.parametrize("name", [n for n in SCRIPTS if n not in OWN_TEST])
def test_smoke_run(name: str, tmp_path: Path) -> None:
    if not _has_smoke(name):
        pytest.fail(f"bench/{name} has no --smoke mode (every bench script needs one)")
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(BENCH.parent / "src"), os.environ.get("PYTHONPATH")) if p
        ),
        "TMPDIR": str(tmp_path),
    }
    res = subprocess.run(
        [sys.executable, str(BENCH / name), "--smoke"],
        cwd=BENCH.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        stdin=subprocess.DEVNULL,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"bench/{name} --smoke exited {res.returncode}:\n{out[-4000:]}"
    assert "Traceback (most recent call last)" not in out, out[-4000:]
    if name in SIMULATES_RANKS:
        # a bench that simulates ranks feeds the monitor what real ranks send: a record
        # the ingest checks reject means its figures are of a job no real rank makes
        assert "invalid heartbeat record" not in out, out[-4000:]
    assert res.stdout.strip(), f"bench/{name} --smoke printed no figure"
    for job, parent in JOBS.items():
        if parent == name:
            assert JOB_EVIDENCE[job] in res.stdout, f"bench/{name} --smoke did not run {job}"
