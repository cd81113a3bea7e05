"""Every bench script runs: ``python bench/<name>.py --smoke`` (tiny sizes, seconds) exits
0 with no traceback, so a figure in bench/README.md cannot silently stop being
reproducible. A new bench script is picked up by itself and must have ``--smoke``; job
scripts that another bench starts (``JOBS``) run inside that bench's smoke run, which must
show it (``JOB_EVIDENCE``)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

from tests.bench import forked

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
    "attribution_job.py": "attribution.py",
    "hang_classes_job.py": "hang_classes.py",
}
JOB_EVIDENCE = {
    "fault_matrix_collective.py": "collective_hang",  # its case's row in the table
    "fault_matrix_launcher.py": "monitor_crash/once",
    "inprocess_job.py": "rankguard fault -> first step after re-entry",
    "goodput_job.py": "faults fired: exception",
    "live_recovery_job.py": "uninterrupted run (torchrun): exit 0",
    "attribution_job.py": "attribution: culprit alone in",
    "hang_classes_job.py": "did not join all_reduce #3",  # the finding's line
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
# Benches whose smoke run is run in the test's process (an interpreter and torch's import
# less: about 2 s of CPU each): they start no launcher (inprocess.py starts its ranks
# itself and waits for them), or wait for the launchers they start from threads they join
# and install nothing in their own process (gpu_check.py: its checks run in its jobs'
# ranks), and leave no global hook (torch's optimizer and module hooks: a bench removes
# those it installed), no environment variable, thread count or thread behind
# (test_smoke_run checks that each left the process as it found it). Any other runs as
# its own process.
IN_PROCESS = {
    "gpu_check.py",
    "monitor_scan.py",
    "phase_sampling.py",
    "perf_overhead.py",
    "hot_path.py",
    "autodetect.py",
    "inprocess.py",
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
    if name in IN_PROCESS:
        before = _process_state()
        code, out, stdout = _smoke_in_process(name, tmp_path)
        assert _process_state(wait_s=5.0) == before, f"bench/{name} changed this process"
    else:
        code, out, stdout = _smoke_as_process(name, tmp_path)
    assert code == 0, f"bench/{name} --smoke exited {code}:\n{out[-4000:]}"
    assert "Traceback (most recent call last)" not in out, out[-4000:]
    if name in SIMULATES_RANKS:
        # a bench that simulates ranks feeds the monitor what real ranks send: a record
        # the ingest checks reject means its figures are of a job no real rank makes
        assert "invalid heartbeat record" not in out, out[-4000:]
    assert stdout.strip(), f"bench/{name} --smoke printed no figure"
    for job, parent in JOBS.items():
        if parent == name:
            assert JOB_EVIDENCE[job] in stdout, f"bench/{name} --smoke did not run {job}"


def _process_state(wait_s: float = 0.0) -> dict[str, object]:
    """What a bench run in this process must leave as it found it: the threads (those
    ending are given ``wait_s``), torch's global optimizer and module hooks, the
    environment and torch's thread count."""
    import threading
    import time

    import torch
    import torch.nn.modules.module as module_hooks
    import torch.optim.optimizer as optimizer_hooks

    deadline = time.monotonic() + wait_s
    while True:
        threads = sorted(t.name for t in threading.enumerate())
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
        if threads == sorted(t.name for t in threading.enumerate()):
            break
    hooks = {
        name: len(getattr(mod, name))
        for mod in (optimizer_hooks, module_hooks)
        for name in dir(mod)
        if name.startswith("_global_") and name.endswith("_hooks")
    }
    return {
        "threads": threads,
        "hooks": hooks,
        # torch's own lazy import of its compiler (a first optimizer step in this process
        # does it) sets where that compiler caches: torch's, not the bench's
        "environ": {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
        "torch threads": torch.get_num_threads(),
    }


def _smoke_in_process(name: str, tmp_path: Path) -> tuple[int, str, str]:
    """``python bench/<name> --smoke`` run as ``__main__`` in this process: its exit code,
    everything it said (its output, its log records, an exception's traceback) and its
    standard output."""
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(io.StringIO()) as stdout,
        contextlib.redirect_stderr(io.StringIO()) as stderr,
    ):
        mp.chdir(BENCH.parent)
        mp.setenv("TMPDIR", str(tmp_path))
        mp.setattr(tempfile, "tempdir", str(tmp_path))
        mp.setattr(sys, "argv", [str(BENCH / name), "--smoke"])
        logs = io.StringIO()
        handler = logging.StreamHandler(logs)
        logging.getLogger().addHandler(handler)
        code: int = 0
        try:
            runpy.run_path(str(BENCH / name), run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:
            code = 1
            traceback.print_exc(file=stderr)
        finally:
            logging.getLogger().removeHandler(handler)
    said = stdout.getvalue() + stderr.getvalue() + logs.getvalue()
    return code, said, stdout.getvalue()


def _smoke_as_process(name: str, tmp_path: Path) -> tuple[int, str, str]:
    """``python bench/<name> --smoke`` as its own process, forked from the forkserver of
    the rank tests (``tests/bench/forked.py``: no interpreter's start and torch's import
    of its own): its exit code, its output and its standard output."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(BENCH.parent / "src"), os.environ.get("PYTHONPATH")) if p
        ),
        "TMPDIR": str(tmp_path),
    }
    res = forked.run(name, "--smoke", timeout=220, env=env)
    return res.returncode, res.stdout + res.stderr, res.stdout
