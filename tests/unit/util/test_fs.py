"""Appends: never through a link, short writes continued, failed writes cut back."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

import rankguard.util.fs as fs


def test_append_refuses_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n", encoding="utf-8")
    link = tmp_path / "findings.jsonl"
    link.symlink_to(victim)
    with pytest.raises(OSError) as err:
        fs.append_jsonl(link, [{"a": 1}])
    assert err.value.errno == errno.ELOOP
    assert victim.read_text(encoding="utf-8") == "keep\n"


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def short(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))  # at most 3 bytes a call

    monkeypatch.setattr(fs.os, "write", short)
    path = tmp_path / "f.jsonl"
    fs.append_jsonl(path, [{"a": 1}, {"b": "xyz"}])
    monkeypatch.undo()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [{"a": 1}, {"b": "xyz"}]


def test_a_failed_write_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.jsonl"
    fs.append_jsonl(path, [{"first": 1}])
    real_write = os.write
    calls = {"n": 0}

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:5]))  # part of the line lands ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

    monkeypatch.setattr(fs.os, "write", disk_full)
    with pytest.raises(OSError) as err:
        fs.append_jsonl(path, [{"second": 2}])
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == '{"first":1}\n'  # cut back
    fs.append_jsonl(path, [{"third": 3}])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [{"first": 1}, {"third": 3}]


# ---- QueuedJsonl: no line lost to a failed write ----------------------------------------


class _NoSpace:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = fs.append_bytes
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(fs, "append_bytes", self)

    def __call__(self, path: Any, data: bytes, *, fsync: bool = True) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def free(self) -> None:
        self.monkeypatch.setattr(fs, "append_bytes", self.real)


def test_queued_jsonl_keeps_unwritten_lines_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.jsonl"
    out = fs.QueuedJsonl(path)
    assert out.append([{"n": 0}]) is True
    disk = _NoSpace(monkeypatch)
    assert out.append([{"n": 1}, {"n": 2}]) is False
    assert out.flush() is False
    assert out.append([{"n": 3}]) is False
    assert out.unwritten == 3 and out.errors == 3 and out.dropped == 0
    assert out.last_error is not None and out.last_error.startswith("f.jsonl: ")
    disk.free()
    assert out.flush() is True
    assert out.unwritten == 0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert out.flush() is True  # nothing queued: nothing written
    assert len(path.read_text().splitlines()) == 4


def test_queued_jsonl_is_bounded_and_keeps_the_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.jsonl"
    out = fs.QueuedJsonl(path, max_pending=2)
    disk = _NoSpace(monkeypatch)
    out.append([{"n": 1}, {"n": 2}, {"n": 3}])
    out.append([{"n": 4}])
    assert out.unwritten == 2 and out.dropped == 2
    disk.free()
    assert out.flush() is True
    assert [json.loads(x)["n"] for x in path.read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError):
        fs.QueuedJsonl(path, max_pending=0)


def test_queued_jsonl_writes_a_batch_larger_than_its_bound_on_a_healthy_disk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.jsonl"
    out = fs.QueuedJsonl(path, max_pending=10_000, fsync=False)
    assert out.append([{"n": i} for i in range(16_384)]) is True
    assert out.dropped == 0 and out.unwritten == 0
    assert len(path.read_text().splitlines()) == 16_384
