"""Retention never follows a symbolic link out of the job's checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

from rankguard.checkpoint.files import COMMIT_MARKER, committed_steps, prune, step_dir_name
from rankguard.checkpoint.local import LocalStore


def _committed(root: Path, step: int, sub: str = "") -> Path:
    d = root / step_dir_name(step) / sub if sub else root / step_dir_name(step)
    d.mkdir(parents=True)
    (d / "data.bin").write_bytes(b"x")
    (d / COMMIT_MARKER).write_text(json.dumps({"step": step}))
    return d


def test_a_linked_step_keeps_the_other_runs_marker(tmp_path: Path) -> None:
    pre = _committed(tmp_path / "pretrain", 100)
    ft = tmp_path / "finetune"
    ft.mkdir()
    (ft / step_dir_name(100)).symlink_to(pre, target_is_directory=True)
    (ft / step_dir_name(50)).symlink_to(tmp_path / "pretrain", target_is_directory=True)
    outside_tmp = tmp_path / "outside"
    outside_tmp.mkdir()
    (outside_tmp / "keep.txt").write_text("x")
    (ft / ".tmp_step_000000001.9").symlink_to(outside_tmp, target_is_directory=True)
    _committed(ft, 200)
    _committed(ft, 300)
    assert [s for s, _ in committed_steps(ft)] == [300, 200]
    assert [s for s, _ in committed_steps(ft, links=True)] == [300, 200, 100]
    removed = prune(ft, 1, protect=set(), keep_tmp_prefix=None)
    assert sorted(p.name for p in removed) == [".tmp_step_000000001.9", step_dir_name(200)]
    assert (pre / COMMIT_MARKER).exists() and (pre / "data.bin").exists()
    assert (outside_tmp / "keep.txt").exists()
    assert (ft / step_dir_name(100)).is_symlink()


def test_local_retention_and_sweeps_stay_in_the_node_directory(tmp_path: Path) -> None:
    other = _committed(tmp_path / "other", 1, "shard_0_on_0")
    tmp_inside = other.parent / ".tmp_shard_0_on_0.77"
    tmp_inside.mkdir()
    root = tmp_path / "local"
    root.mkdir()
    (root / step_dir_name(1)).symlink_to(other.parent, target_is_directory=True)
    for step in (2, 3, 4):
        _committed(root, step, "shard_0_on_0")
    LocalStore(root, 0, "crc32").prune(1, protect=set())
    assert (other / COMMIT_MARKER).exists() and tmp_inside.exists()
    assert sorted(p.name for p in root.iterdir()) == [step_dir_name(1), step_dir_name(4)]
