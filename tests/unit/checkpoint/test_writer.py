"""The background writer of an async save: it runs at the priority that leaves the
cores to the training (never the training thread's), and its manifest's checksums are
taken as the files are written (no second read of the checkpoint), equal to a read."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.checkpoint import CheckpointConfig, CheckpointManager
from rankguard.checkpoint import files as ckfiles
from rankguard.checkpoint.files import MANIFEST_FILE, checksum_file
from rankguard.checkpoint.writer import Digest
from rankguard.util.cpuprio import yield_cpu

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes"),
]


def _policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def test_yield_cpu_lowers_the_calling_thread_only() -> None:
    before = _policy()
    seen: dict[str, Any] = {}

    def writer() -> None:
        seen["class"] = yield_cpu()
        seen["policy"] = _policy()
        seen["again"] = yield_cpu()

    t = threading.Thread(target=writer)
    t.start()
    t.join(10)
    assert seen == {"class": "idle", "policy": os.SCHED_IDLE, "again": "idle"}
    assert _policy() == before == os.SCHED_OTHER


def test_digest_matches_a_read_of_the_file(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (tmp_path / "f").write_bytes(data)
    for algo in ("crc32", "blake2b"):
        digest = Digest(algo)
        for i in range(0, len(data), 1 << 20):
            digest.update(data[i : i + (1 << 20)])
        assert digest.size == len(data)
        assert digest.hexdigest() == checksum_file(tmp_path / "f", algo)


@pytest.mark.parametrize("algo", ["crc32", "blake2b"])
def test_an_async_save_in_the_training_process_reads_nothing_back(
    tmp_path: Path, algo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankguard.checkpoint.background import BackgroundWriter

    policies: dict[str, int] = {}
    write_data = BackgroundWriter.write_data

    def spy(self: BackgroundWriter, plan: Any, planner: Any) -> Any:
        out = write_data(self, plan, planner)
        policies["writer"] = _policy()
        return out

    read_back: list[str] = []

    def counted(path: Path, algo: str) -> str:
        read_back.append(path.name)
        return checksum_file(path, algo)

    monkeypatch.setattr(BackgroundWriter, "write_data", spy)
    monkeypatch.setattr(ckfiles, "checksum_file", counted)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=True, checksum=algo)
    with CheckpointManager(config, {"model": model, "optim": opt}, session=False) as m:
        m.save(1)
        m.wait()
        assert _policy() == os.SCHED_OTHER  # the training thread keeps its priority
    # DCP's writing thread shares the interpreter lock with the training thread: it keeps
    # the training's priority (one in SCHED_IDLE could hold the lock while descheduled)
    assert policies == {"writer": os.SCHED_OTHER}
    assert read_back == []
    step = tmp_path / "ckpt" / "step_000000001"
    manifest = json.loads((step / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp", "rank_0.state"}
    for name, entry in manifest["files"].items():
        assert entry["checksum"] == checksum_file(step / name, algo), name


def test_the_writer_yields_the_cpu_only_in_another_process(tmp_path: Path) -> None:
    """In DCP's checkpoint process (``async_checkpointer_type: process``) the write runs
    in SCHED_IDLE; in the process that built the writer it never changes a priority."""
    from rankguard.checkpoint.background import BackgroundWriter

    writer = BackgroundWriter(tmp_path / "w")
    seen: dict[str, Any] = {}

    def look() -> None:
        seen["here"] = writer.yield_if_elsewhere(), _policy()
        writer._owner_pid = os.getpid() + 1  # as in the checkpoint process
        seen["there"] = writer.yield_if_elsewhere(), _policy()

    t = threading.Thread(target=look)
    t.start()
    t.join()
    assert seen == {"here": (False, os.SCHED_OTHER), "there": (True, os.SCHED_IDLE)}
    assert _policy() == os.SCHED_OTHER


def test_a_sync_save_never_lowers_the_training_thread(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 8)
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=False)
    with CheckpointManager(config, {"model": model}, session=False) as m:
        m.save(1)
    assert _policy() == os.SCHED_OTHER


def test_a_local_shard_is_checksummed_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_back: list[str] = []

    def counted(path: Path, algo: str) -> str:
        read_back.append(path.name)
        return checksum_file(path, algo)

    monkeypatch.setattr(ckfiles, "checksum_file", counted)
    model = torch.nn.Linear(16, 16)
    config = CheckpointConfig(
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(tmp_path / "local"),
        async_save=True,
    )
    with CheckpointManager(config, {"model": model}, session=False) as m:
        m.save(1, tier="local")
        m.wait()
        assert m.last_committed["local"] == 1
    assert read_back == []
    shard = tmp_path / "local" / "step_000000001" / "shard_0_on_0"
    manifest = json.loads((shard / MANIFEST_FILE).read_text())
    assert manifest["files"]["shard.pt"]["checksum"] == checksum_file(shard / "shard.pt", "crc32")
