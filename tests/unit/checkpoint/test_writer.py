"""The background writer of an async save: it runs at the priority that leaves the
cores to the training (never the training thread's), and its manifest's checksums are
taken as the files are written (no second read of the checkpoint), equal to a read; its
files go to disk past the page cache where the file system allows it."""

from __future__ import annotations

import errno
import fcntl
import importlib
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.checkpoint import CheckpointConfig, CheckpointManager
from rankguard.checkpoint import files as ckfiles
from rankguard.checkpoint.files import MANIFEST_FILE, checksum_file
from rankguard.checkpoint.idlewrite import restore_permitted
from rankguard.checkpoint.writer import Digest, DigestFile
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


def _policies_in_write_data(
    writer: Any, monkeypatch: pytest.MonkeyPatch, slow_s: float = 0.0
) -> tuple[list[int], int]:
    """``writer.write_data`` on a thread of its own, DCP's own write replaced: the
    thread's policy as that write starts and after ``slow_s`` s, then after the call."""
    seen: list[int] = []

    def fake_write(self: Any, plan: Any, planner: Any) -> None:
        seen.append(_policy())
        time.sleep(slow_s)
        seen.append(_policy())

    monkeypatch.setattr(type(writer).__mro__[1], "write_data", fake_write)
    after: list[int] = []

    def run() -> None:
        writer.write_data(None, None)
        after.append(_policy())

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    return seen, after[0]


def test_the_writer_yields_the_cpu_only_in_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In DCP's checkpoint process (``async_checkpointer_type: process``) the write runs
    in SCHED_IDLE and its thread gets its policy back after it (or, where the process may
    not raise it back, stays lowered); in the process that built the writer it never
    changes a priority."""
    from rankguard.checkpoint import idlewrite
    from rankguard.checkpoint.background import BackgroundWriter

    writer = BackgroundWriter(tmp_path / "w")
    assert not writer.in_checkpoint_process()
    here = _policies_in_write_data(writer, monkeypatch)
    writer._owner_pid = os.getpid() + 1  # as in the checkpoint process
    assert writer.in_checkpoint_process()
    there = _policies_in_write_data(writer, monkeypatch)
    assert here == ([os.SCHED_OTHER] * 2, os.SCHED_OTHER)
    if idlewrite.restore_permitted():
        assert there == ([os.SCHED_IDLE] * 2, os.SCHED_OTHER)
    else:
        assert there == ([os.SCHED_IDLE] * 2, os.SCHED_IDLE)
    assert _policy() == os.SCHED_OTHER


@pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE") or not restore_permitted(),
    reason="raising a thread back from SCHED_IDLE not permitted",
)
def test_the_checkpoint_process_write_is_bounded_like_the_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training that leaves no idle core cannot starve the process writer for good:
    after ``async_idle_max_s`` its write goes on at the normal priority."""
    from rankguard.checkpoint.background import BackgroundWriter

    writer = BackgroundWriter(tmp_path / "w", idle_max_s=0.05)
    writer._owner_pid = os.getpid() + 1
    seen, after = _policies_in_write_data(writer, monkeypatch, slow_s=0.5)
    assert (seen, after) == ([os.SCHED_IDLE, os.SCHED_OTHER], os.SCHED_OTHER)


def test_a_stand_in_for_the_permission_ends_with_it_whenever_the_writer_was_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's module imported while ``restore_permitted`` was replaced (a test that
    replaces it is the first in its process to import the writer): once the replacement
    is gone, the checkpoint process's write asks the real answer, as its window does. A
    name bound at the import kept the replacement (False): the write in SCHED_IDLE for
    good (its thread never brought back), though the real answer is True."""
    import rankguard.checkpoint
    from rankguard.checkpoint import background, idlewrite

    monkeypatch.delitem(sys.modules, background.__name__)  # both given back after the test
    monkeypatch.setattr(rankguard.checkpoint, "background", background)
    with monkeypatch.context() as m:
        m.setattr(idlewrite, "restore_permitted", lambda: False)
        fresh = importlib.import_module(background.__name__)
    assert fresh is not background
    writer = fresh.BackgroundWriter(tmp_path / "w")
    writer._owner_pid = os.getpid() + 1  # as in the checkpoint process
    there = _policies_in_write_data(writer, monkeypatch)
    if idlewrite.restore_permitted():
        assert there == ([os.SCHED_IDLE] * 2, os.SCHED_OTHER)
    else:
        assert there == ([os.SCHED_IDLE] * 2, os.SCHED_IDLE)


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


def _direct_refused(directory: Path) -> bool:
    """The file system of ``directory`` has no ``O_DIRECT`` (tmpfs)."""
    try:
        fd = os.open(directory / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return True
    os.close(fd)
    (directory / ".probe").unlink()
    return False


def _spy_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int, int]]:
    """Every ``os.write``: (the file open with O_DIRECT, its offset, the bytes)."""
    seen: list[tuple[bool, int, int]] = []
    write = os.write

    def spy(fd: int, data: Any) -> int:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        seen.append((direct, os.lseek(fd, 0, os.SEEK_CUR), memoryview(data).nbytes))
        return write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    return seen


@pytest.mark.parametrize("total", [0, 1, 4095, 4096, 4097, 3 << 20, (3 << 20) + 5, 7_000_001])
@pytest.mark.parametrize("direct", [True, False])
def test_a_digest_file_holds_the_bytes_written_and_their_checksum(
    tmp_path: Path, total: int, direct: bool
) -> None:
    data = os.urandom(total)
    out = DigestFile(tmp_path / "f", Digest("crc32"), direct=direct, buffer_bytes=1 << 20)
    sizes = [1, 100, 5000, 1 << 20, 3 << 20, 77]
    start = 0
    for i in itertools.count():
        if start >= total:
            break
        out.write(data[start : start + sizes[i % len(sizes)]])
        out.flush()  # DCP flushes after every item: the aligned writes go on
        start += sizes[i % len(sizes)]
    assert out.tell() == total
    out.close()
    out.close()
    assert (tmp_path / "f").read_bytes() == data
    assert out.digest.size == total
    assert out.digest.hexdigest() == checksum_file(tmp_path / "f", "crc32")


def test_an_async_save_writes_past_the_page_cache_and_a_bad_file_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk of an async save's data file goes to disk with O_DIRECT, in whole
    blocks at aligned offsets; a flipped byte or a cut file is still refused."""
    if _direct_refused(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    writes = _spy_writes(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # 4 x 1 MB of moments and weights
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=True)
    with CheckpointManager(config, {"model": model, "optim": opt}, session=False) as m:
        m.save(1)
        m.wait()
        assert m.last_committed["persistent"] == 1
    monkeypatch.undo()
    data = tmp_path / "ckpt" / "step_000000001" / "__0_0.distcp"
    size = data.stat().st_size
    direct = [(at, n) for is_direct, at, n in writes if is_direct]
    assert sum(n for _, n in direct) > 0.9 * size
    assert all(at % 4096 == 0 and n % 4096 == 0 for at, n in direct)
    step = data.parent
    manifest = ckfiles.read_manifest(step)
    ckfiles.verify_files(step, manifest, sorted(manifest.files))
    raw = bytearray(data.read_bytes())
    raw[size // 2] ^= 0x01
    data.write_bytes(raw)
    with pytest.raises(ckfiles.CheckpointError, match="corrupt"):
        ckfiles.verify_files(step, manifest, ["__0_0.distcp"])
    data.write_bytes(raw[: size - 1])
    with pytest.raises(ckfiles.CheckpointError, match="torn or truncated"):
        ckfiles.verify_files(step, manifest, ["__0_0.distcp"])


def test_a_direct_write_the_device_refuses_goes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _direct_refused(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    write = os.write

    def refuse(fd: int, data: Any) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return write(fd, data)

    monkeypatch.setattr(os, "write", refuse)
    data = os.urandom((2 << 20) + 10)
    out = DigestFile(tmp_path / "f", Digest("crc32"), buffer_bytes=1 << 20)
    assert out.direct
    out.write(data)
    out.close()
    assert not out.direct
    assert (tmp_path / "f").read_bytes() == data
    assert out.digest.hexdigest() == checksum_file(tmp_path / "f", "crc32")


def test_dcps_checkpoint_process_writes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training process reads those files back to checksum them: from the cache."""
    import torch.distributed.checkpoint as dcp

    from rankguard.checkpoint.background import BackgroundWriter

    if _direct_refused(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    writes = _spy_writes(monkeypatch)
    writer = BackgroundWriter(tmp_path / "w")
    writer._owner_pid = os.getpid() + 1  # as in the checkpoint process
    state = {"w": torch.randn(1 << 20)}
    t = threading.Thread(target=lambda: dcp.save(state, storage_writer=writer, no_dist=True))
    t.start()  # in its own thread: the write lowers the thread's priority for good
    t.join(30)
    monkeypatch.undo()
    assert sum(n for _, _, n in writes) >= 4 << 20
    assert not any(direct for direct, _, _ in writes)
    assert writer.checksums()["__0_0.distcp"].hexdigest() == checksum_file(
        tmp_path / "w" / "__0_0.distcp", "crc32"
    )


class _Unhashed(Digest):
    """The copy alone (a CRC-32 of the bytes lets go of the lock too)."""

    def __init__(self) -> None:
        super().__init__("crc32")

    def update(self, data: Any) -> None:
        pass


def test_the_copy_into_the_direct_buffer_lets_the_training_thread_run(
    tmp_path: Path,
) -> None:
    """An async save writes from a thread of the training process: its copy of a big
    record into the aligned buffer must not hold the interpreter lock, or the training
    thread waits for the lock through the whole copy at its next operator."""
    if _direct_refused(tmp_path):
        pytest.skip("no O_DIRECT here: no buffer copy")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(30.0)  # the lock changes hands only where its holder lets go
    size = 64 << 20
    data = memoryview(os.urandom(size))
    stamps: list[float] = []
    stop = threading.Event()

    def training() -> None:  # a stamp needs the lock
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0002)

    windows = []
    thread = threading.Thread(target=training)
    try:
        thread.start()
        for i in range(8):
            # the buffer takes the whole record: the copy only, no write to the file
            out = DigestFile(tmp_path / f"f{i}", _Unhashed(), direct=True, buffer_bytes=size + 4096)
            assert out.direct
            t0 = time.perf_counter()
            out.write(data)
            windows.append((t0, time.perf_counter()))
            if i < 7:
                out.abandon()  # the copy was the point: nothing more to disk
            else:
                out.close()
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(previous)
    inside = [sum(t0 < s < t1 for s in stamps) for t0, t1 in windows]
    assert sum(inside) > 0, (inside, [round(t1 - t0, 4) for t0, t1 in windows])
    assert (tmp_path / "f7").read_bytes() == data
