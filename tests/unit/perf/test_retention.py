"""``perf.keep_runs`` prunes the runs of this job only: another job's runs in the same
log directory, another user's, symlinks and unmarked directories survive."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankguard.perf.reporter import PERF_LOG, prune_runs, run_job
from rankguard.schema.layout import PERF_JOB_FILE


def _run(root: Path, name: str, mtime: float, job: str | None, *, marker: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / PERF_LOG).write_text("{}\n")
    if marker:
        (d / PERF_JOB_FILE).write_text(json.dumps({"job": job, "run_id": name}))
    os.utime(d, (mtime, mtime))
    return d


def test_another_jobs_runs_in_the_same_log_dir_survive(tmp_path: Path) -> None:
    mine = [_run(tmp_path, f"mine{i}", 1_000_000 + i, "/home/a/train.py") for i in range(4)]
    theirs = [_run(tmp_path, f"theirs{i}", 900_000 + i, "/home/b/pretrain.py") for i in range(3)]
    legacy = _run(tmp_path, "legacy", 1.0, None, marker=False)
    removed = prune_runs(tmp_path, keep=2, current=mine[3])
    assert sorted(removed) == sorted(mine[:2])
    assert all(d.exists() for d in [*mine[2:], *theirs, legacy])


def test_the_job_is_read_from_the_marker(tmp_path: Path) -> None:
    assert run_job(_run(tmp_path, "a", 1.0, "m.train")) == "m.train"
    assert run_job(_run(tmp_path, "b", 1.0, None, marker=False)) is None
    bad = _run(tmp_path, "c", 1.0, None, marker=False)
    (bad / PERF_JOB_FILE).write_text("{not json")
    assert run_job(bad) not in (None, "m.train")  # matches no job


def test_an_unreadable_marker_is_never_pruned(tmp_path: Path) -> None:
    runs = [_run(tmp_path, f"r{i}", 1_000_000 + i, "job") for i in range(3)]
    (runs[0] / PERF_JOB_FILE).write_text("{not json")
    prune_runs(tmp_path, keep=1, current=runs[2])
    assert runs[0].exists() and not runs[1].exists()


def test_a_symlinked_run_is_not_followed(tmp_path: Path) -> None:
    elsewhere = _run(tmp_path / "elsewhere", "precious", 1.0, "job")
    root = tmp_path / "perf_monitor"
    runs = [_run(root, f"r{i}", 1_000_000 + i, "job") for i in range(2)]
    (root / "link").symlink_to(elsewhere)
    prune_runs(root, keep=1, current=runs[1])
    assert elsewhere.exists() and (root / "link").is_symlink()
    assert not runs[0].exists()


def test_another_users_run_is_not_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [_run(tmp_path, f"r{i}", 1_000_000 + i, "job") for i in range(3)]
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 4242)  # what exists is someone else's
    assert prune_runs(tmp_path, keep=1, current=runs[2]) == []
    assert all(d.exists() for d in runs)


def test_the_reporter_marks_its_job_and_prunes_only_it(tmp_path: Path) -> None:
    from rankguard.perf.config import PerfConfig
    from rankguard.perf.reporter import PerfReporter
    from rankguard.rank.timeline import ProgressTracker

    root = tmp_path / "perf_monitor"
    old = [_run(root, f"old{i}", 1_000_000 + i, "/jobs/train.py") for i in range(2)]
    other = _run(root, "other", 1_000_000, "/jobs/eval.py")
    reporter = PerfReporter(
        PerfConfig(keep_runs=2, console=False),
        ProgressTracker(),
        rank=0,
        world_size=1,
        run_id="new",
        out_dir=root / "new",
        job="/jobs/train.py",
    )
    reporter.close()
    assert run_job(root / "new") == "/jobs/train.py"
    assert json.loads((root / "new" / PERF_JOB_FILE).read_text())["uid"] == os.getuid()
    assert not old[0].exists() and old[1].exists() and other.exists()
