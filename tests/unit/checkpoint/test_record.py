"""``checkpoints.json`` as rank 0 writes it: its keys, their order and their values after
a sync save, an async save (in flight, then committed), a failed save and a load."""

from __future__ import annotations

import errno
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from rankguard.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager

pytestmark = pytest.mark.timeout(60)

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")
KEYS = [
    "rank",
    "world_size",
    "job",
    "async_save",
    "last_committed",
    "saves",
    "failures",
    "last_error",
    "last",
    "inflight",
    "loaded",
    "updated",
]
LAST_KEYS = ["step", "path", "time", "stage_s", "write_s", "total_s"]


class Faulty(FileSystemWriter):
    """DCP's writer that waits while ``hold`` is clear and fails while ``fail`` is set."""

    hold = threading.Event()
    fail = threading.Event()

    def write_data(self, plan: Any, planner: Any) -> Any:
        assert Faulty.hold.wait(10)
        if Faulty.fail.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write_data(plan, planner)


def _read(path: Path) -> dict[str, Any]:
    """The file, its times checked and replaced by ``<time>``, its durations by ``<s>``."""
    doc: dict[str, Any] = json.loads(path.read_text())
    assert list(doc) == KEYS
    assert ISO.match(doc["updated"])
    doc["updated"] = "<time>"
    for last in doc["last"].values():
        if last is not None:
            assert list(last) == LAST_KEYS and ISO.match(last["time"])
            last["time"] = "<time>"
            for key in ("stage_s", "write_s", "total_s"):
                assert isinstance(last[key], float) and last[key] >= 0
                last[key] = "<s>"
    if doc["inflight"] is not None:
        assert list(doc["inflight"]) == ["tier", "step", "since"]
        assert ISO.match(doc["inflight"]["since"])
        doc["inflight"]["since"] = "<time>"
    return doc


def test_checkpoints_json_after_each_event(tmp_path: Path) -> None:
    status = tmp_path / "run" / "checkpoints.json"
    save = tmp_path / "ckpt"
    config = CheckpointConfig(save=str(save), async_save=False)
    model = torch.nn.Linear(3, 2)
    Faulty.hold.set()
    Faulty.fail.clear()
    m = CheckpointManager(
        config,
        {"model": model},
        job_id="job-a",
        session=False,
        status_path=status,
        writer_factory=Faulty,
    )
    empty = {
        "rank": 0,
        "world_size": 1,
        "job": "job-a",
        "async_save": False,
        "last_committed": {"persistent": None, "local": None},
        "saves": {"persistent": 0, "local": 0},
        "failures": 0,
        "last_error": None,
        "last": {"persistent": None, "local": None},
        "inflight": None,
        "loaded": None,
        "updated": "<time>",
    }
    assert _read(status) == empty

    m.save(1)  # sync
    last1 = {
        "step": 1,
        "path": str(save / "step_000000001"),
        "time": "<time>",
        "stage_s": "<s>",
        "write_s": "<s>",
        "total_s": "<s>",
    }
    after1 = {
        **empty,
        "last_committed": {"persistent": 1, "local": None},
        "saves": {"persistent": 1, "local": 0},
        "last": {"persistent": last1, "local": None},
    }
    assert _read(status) == after1

    Faulty.hold.clear()
    m.save(2, blocking=False)  # async: in flight until the writer is let go
    inflight = {"tier": "persistent", "step": 2, "since": "<time>"}
    assert _read(status) == {**after1, "inflight": inflight}
    Faulty.hold.set()
    m.wait()
    after2 = {
        **after1,
        "last_committed": {"persistent": 2, "local": None},
        "saves": {"persistent": 2, "local": 0},
        "last": {"persistent": {**last1, "step": 2, "path": str(save / "step_000000002")}},
    }
    after2["last"]["local"] = None
    assert _read(status) == after2

    Faulty.fail.set()
    with pytest.raises(CheckpointError) as info:
        m.save(3)
    Faulty.fail.clear()
    error = (
        "checkpoint step 3 (persistent) FAILED, nothing committed (the latest persistent "
        "checkpoint is still step 2): "
    )
    assert str(info.value).startswith(error) and "No space left" in str(info.value)
    after3 = {**after2, "failures": 1, "last_error": str(info.value)}
    assert _read(status) == after3
    m.close()

    with CheckpointManager(
        config, {"model": model}, job_id="job-a", session=False, status_path=status
    ) as m2:
        assert _read(status) == {
            **empty,
            "last_committed": {"persistent": 2, "local": None},
        }
        assert m2.load_latest() == 2
        assert _read(status) == {
            **empty,
            "last_committed": {"persistent": 2, "local": None},
            "loaded": {"tier": "persistent", "step": 2, "path": str(save / "step_000000002")},
        }
