"""Appends: never through a link, short writes continued, failed writes cut back."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import rankguard._fs as fs


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
