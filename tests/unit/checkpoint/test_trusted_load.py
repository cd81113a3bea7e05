"""A planted checkpoint cannot run code at load time, and untrusted roots are refused.

The attacker here rewrites everything a checkpoint has (the per-rank file, the manifest
and the commit marker), as another user of a shared directory could.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.storage as torch_storage

from rankguard.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    CheckpointManager,
    DataPosition,
    RNGState,
)
from rankguard.checkpoint.files import (
    COMMIT_MARKER,
    MANIFEST_FILE,
    checksum_bytes,
    root_problem,
)
from rankguard.checkpoint.state import StatePlan, UnsafeStateError, load_plain

pytestmark = pytest.mark.timeout(60)


class _Payload:
    """Unpickling this makes a directory: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _state(data: DataPosition) -> dict[str, Any]:
    model = torch.nn.Linear(2, 2)
    return {"model": model, "data": data, "rng": RNGState()}


def _manager(tmp_path: Path, data: DataPosition, **kw: Any) -> CheckpointManager:
    cfg = CheckpointConfig(save=str(tmp_path / "ckpt"), **kw)
    return CheckpointManager(cfg, _state(data), job_id="job-a", session=False)


def _plant(step_dir: Path, name: str, data: bytes) -> None:
    """Replace one file and rewrite the manifest and marker to match, as an attacker can."""
    (step_dir / name).write_bytes(data)
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    algo = manifest.get("checksum", "crc32")
    manifest["files"][name].update(size=len(data), checksum=checksum_bytes(data, algo))
    raw = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (step_dir / MANIFEST_FILE).write_bytes(raw)
    marker = json.loads((step_dir / COMMIT_MARKER).read_text())
    marker["manifest_checksum"] = checksum_bytes(raw, algo)
    (step_dir / COMMIT_MARKER).write_text(json.dumps(marker))


def test_plain_state_of_the_current_format_loads() -> None:
    data = DataPosition(epoch=2, index=7, extra={"a": [1, 2.5, None, (True, "x")], "s": {3}})
    data.extra["n"] = np.arange(4)
    plan = StatePlan({"data": data, "rng": RNGState()})
    saved = plan.per_rank_bytes()  # the format every existing checkpoint has
    expect = torch.get_rng_state().clone()
    torch.rand(3)
    back = DataPosition()
    StatePlan({"data": back, "rng": RNGState()}).load_per_rank(saved)
    assert (back.epoch, back.index) == (2, 7)
    assert back.extra["a"] == [1, 2.5, None, (True, "x")] and back.extra["s"] == {3}
    assert np.array_equal(back.extra["n"], np.arange(4))
    assert torch.equal(torch.get_rng_state(), expect)


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = pickle.dumps({"data": _Payload(marker)})
    with pytest.raises(UnsafeStateError, match=r"posix\.mkdir|os\.mkdir"):
        load_plain(evil)
    assert not marker.exists()


def test_a_tensor_storage_hiding_a_pickle_is_refused(tmp_path: Path) -> None:
    """A tensor's storage is itself a torch.save; torch's own unpickling of it would run
    whatever it holds."""
    marker = tmp_path / "ran"
    inner = io.BytesIO()
    torch.save(_Payload(marker), inner)

    class Smuggle:
        def __reduce__(self) -> tuple[Any, ...]:
            return (torch_storage._load_from_bytes, (inner.getvalue(),))

    with pytest.raises(UnsafeStateError):
        load_plain(pickle.dumps({"data": Smuggle()}))
    assert not marker.exists()


def test_garbage_is_an_error_not_a_crash() -> None:
    for data in (b"", b"not a pickle", pickle.dumps([1, 2])):
        with pytest.raises(UnsafeStateError):
            StatePlan({"data": DataPosition()}).load_per_rank(data)


def test_planted_newest_checkpoint_runs_nothing_and_the_previous_loads(tmp_path: Path) -> None:
    with _manager(tmp_path, DataPosition(index=3)) as m:
        m.save(1)
        m.save(999_999_999)
    marker = tmp_path / "ran"
    newest = tmp_path / "ckpt" / "step_999999999"
    _plant(newest, "rank_0.state", pickle.dumps({"data": _Payload(marker)}))
    data = DataPosition()
    with _manager(tmp_path, data) as m:
        assert m.load_latest() == 1
    assert not marker.exists()
    assert data.index == 3


def test_world_writable_or_foreign_roots_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert "writable by every user" in (root_problem(open_dir) or "")
    cfg = CheckpointConfig(save=str(open_dir))
    with pytest.raises(CheckpointError, match="writable by every user"):
        CheckpointManager(cfg, _state(DataPosition()), job_id="j", session=False)
    local = CheckpointConfig(
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(open_dir),
        non_persistent_save_interval=1,
    )
    with pytest.raises(CheckpointError, match="writable by every user"):
        CheckpointManager(local, _state(DataPosition()), job_id="j", session=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    assert root_problem(mine) is None
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 4242)
    assert "belongs to" in (root_problem(mine) or "")
    assert root_problem(mine, owner=False) is None  # read-only use of another's
    assert root_problem(tmp_path / "missing") is None


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "a/../../b", "", "x\\y"])
def test_manifest_names_outside_the_checkpoint_are_refused(tmp_path: Path, name: str) -> None:
    from rankguard.checkpoint.files import read_manifest

    with _manager(tmp_path, DataPosition()) as m:
        m.save(1)
    step = tmp_path / "ckpt" / "step_000000001"
    manifest = json.loads((step / MANIFEST_FILE).read_text())
    manifest["files"][name] = {"size": 1, "checksum": "0", "rank": 0}
    raw = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (step / MANIFEST_FILE).write_bytes(raw)
    marker = json.loads((step / COMMIT_MARKER).read_text())
    marker["manifest_checksum"] = checksum_bytes(raw, manifest.get("checksum", "crc32"))
    (step / COMMIT_MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"relative path|leaves the checkpoint"):
        read_manifest(step)


@pytest.mark.timeout(20)
def test_a_device_planted_as_a_checkpoint_file_does_not_hang_the_load(tmp_path: Path) -> None:
    with _manager(tmp_path, DataPosition(index=4)) as m:
        m.save(1)
        m.save(2)
    newest = tmp_path / "ckpt" / "step_000000002"
    (newest / "rank_0.state").unlink()
    (newest / "rank_0.state").symlink_to("/dev/zero")
    (newest / MANIFEST_FILE).rename(newest / "manifest.real")
    (newest / MANIFEST_FILE).symlink_to("/dev/zero")
    data = DataPosition()
    with _manager(tmp_path, data) as m:
        assert m.load_latest() == 1
    assert data.index == 4
