"""JsonlTailer: incremental reads, partial lines, malformed lines, truncation, replacement."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankguard.util.tailer import JsonlTailer


def _line(obj: object) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_missing_file_returns_empty(tmp_path: Path) -> None:
    tailer = JsonlTailer(tmp_path / "nope.jsonl")
    assert tailer.read() == []
    assert tailer.offset == 0 and tailer.malformed == 0 and tailer.truncations == 0


def test_reads_only_new_records(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, _line({"seq": 0}) + _line({"seq": 1}))
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"seq": 0}, {"seq": 1}]
    assert tailer.read() == []  # nothing new
    _append(path, _line({"seq": 2}))
    assert tailer.read() == [{"seq": 2}]
    assert tailer.offset == path.stat().st_size


def test_partial_last_line_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    full = _line({"seq": 0, "event": "heartbeat"})
    second = _line({"seq": 1, "event": "heartbeat"})
    _append(path, full + second[:7])
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"seq": 0, "event": "heartbeat"}]
    assert tailer.offset == len(full)
    assert tailer.malformed == 0
    # only the partial line still: nothing, and it is not counted as malformed
    assert tailer.read() == []
    assert tailer.malformed == 0
    _append(path, second[7:])
    assert tailer.read() == [{"seq": 1, "event": "heartbeat"}]
    assert tailer.malformed == 0
    assert tailer.offset == len(full) + len(second)


def test_file_with_only_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, b'{"seq": 0')
    tailer = JsonlTailer(path)
    assert tailer.read() == []
    assert tailer.offset == 0
    _append(path, b"}\n")
    assert tailer.read() == [{"seq": 0}]


def test_malformed_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(
        path,
        _line({"seq": 0})
        + b"this is not json\n"
        + b'{"seq": 1, "torn\n'
        + b"\xff\xfe\n"
        + b"\n"
        + _line({"seq": 2}),
    )
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"seq": 0}, {"seq": 2}]
    assert tailer.malformed == 3  # the blank line is not malformed


def test_non_dict_json_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, b'[1, 2]\n42\n"text"\nnull\n' + _line({"ok": True}))
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"ok": True}]
    assert tailer.malformed == 4


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, _line({"seq": 0}) + _line({"seq": 1}) + _line({"seq": 2}))
    tailer = JsonlTailer(path)
    assert len(tailer.read()) == 3
    # rewritten shorter in place (same inode)
    with open(path, "r+b") as fh:
        fh.truncate(0)
    _append(path, _line({"seq": 9}))
    assert tailer.read() == [{"seq": 9}]
    assert tailer.truncations == 1
    assert tailer.offset == path.stat().st_size


def test_truncation_detected_with_known_size(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, _line({"seq": 0}) + _line({"seq": 1}))
    tailer = JsonlTailer(path)
    assert len(tailer.read(path.stat().st_size)) == 2
    path.write_bytes(_line({"x": 1}))
    assert tailer.read(path.stat().st_size) == [{"x": 1}]
    assert tailer.truncations == 1


def test_replaced_file_restarts(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, _line({"gen": 1, "seq": 0}))
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"gen": 1, "seq": 0}]
    # replaced by a new file (new inode) that is longer than the old offset
    new = tmp_path / "a.jsonl.new"
    _append(new, _line({"gen": 2, "seq": 0}) + _line({"gen": 2, "seq": 1}))
    old_ino = path.stat().st_ino
    keep = tmp_path / "keep"  # keep the old inode allocated so it cannot be reused
    os.link(path, keep)
    os.replace(new, path)
    assert path.stat().st_ino != old_ino
    assert tailer.read() == [{"gen": 2, "seq": 0}, {"gen": 2, "seq": 1}]
    assert tailer.truncations == 1


def test_file_deleted_then_recreated(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _append(path, _line({"seq": 0}))
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"seq": 0}]
    old_ino = path.stat().st_ino
    path.unlink()
    assert tailer.read() == []
    _append(path, _line({"seq": 0, "again": True}))
    if path.stat().st_ino != old_ino:
        pytest.skip("the filesystem did not reuse the inode number")
    assert tailer.read() == [{"seq": 0, "again": True}]
    assert tailer.malformed == 0


def test_a_line_nested_too_deeply_is_one_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / "hb.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"[" * 100_000 + b'\n{"b": 2}\n')
    tailer = JsonlTailer(path)
    assert tailer.read() == [{"a": 1}, {"b": 2}]
    assert tailer.malformed == 1
