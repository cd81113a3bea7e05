"""End to end: what a user reads last after a failure (the console, status.json,
``rankguard status``) is true. A rank that leaves early ends in a final state, with a
root cause that agrees with the findings.

Elsewhere: a ``@record`` script that raises (torchrun's failure summary, then the
verdict, ``rankguard status``),
``test_run_e2e.py::test_crash_names_the_failing_rank_as_root_cause``; a hang that fault
tolerance ends with no restart left, ``test_nvrx_client_e2e.py`` (ft_launcher's flags,
``--max-restarts 1`` spent on the first hang); a SIGTERM to the launcher (state stopped, no finding,
``rankguard status``), ``test_run_files_e2e.py``; ``findings.jsonl`` there and empty
from the start of a run, ``tests/tier2/test_run_end_tier2.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    read_jsonl,
    read_status,
    run_rankguard,
    standalone_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FINAL = ("completed", "failed", "stopped")


def _status_screen(run_dir: Path) -> str:
    shown = run_rankguard(["status", str(run_dir)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "launcher gone" not in shown.stdout and "killed?" not in shown.stdout, shown.stdout
    return shown.stdout


def _rankguard_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[rankguard] ")]


def test_a_rank_that_leaves_early_ends_failed_with_it_named(tmp_path: Path, run_id: str) -> None:
    res = run_rankguard(
        [*standalone_run(run_id, tmp_path), str(SCRIPTS / "leave_early.py")], timeout=150
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_status(run_dir)["state"] == "failed", out
    assert "[rankguard] run failed: 1 finding(s)" in out, out
    (finding,) = read_jsonl(run_dir / "findings.jsonl")
    assert (finding["rank"], finding["exit"]["peers_ended_first"]) == (0, [1]), finding
    (cause,) = [line for line in _rankguard_lines(out) if "root cause:" in line]
    assert cause.startswith("[rankguard] root cause: rank 1 left the job early"), out
    assert "state failed" in _status_screen(run_dir)
