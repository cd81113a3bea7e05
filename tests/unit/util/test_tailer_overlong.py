"""The tailer skips a line longer than its limit and goes on with the next ones."""

from __future__ import annotations

import json
from pathlib import Path

from rankguard.util.tailer import JsonlTailer


def test_overlong_line_is_skipped_and_reading_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    tailer = JsonlTailer(path, max_line=64)
    path.write_text(json.dumps({"a": 1}) + "\n", encoding="utf-8")
    assert tailer.read() == [{"a": 1}]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"big": "' + "x" * 150)  # no end yet, longer than the limit
    assert tailer.read() == []
    assert tailer.overlong == 1
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("x" * 100)  # still the same line
    assert tailer.read() == []
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('"}\n' + json.dumps({"b": 2}) + "\n")
    assert tailer.read() == [{"b": 2}]
    assert tailer.overlong == 1 and tailer.malformed == 0
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"c": "y" * 100}) + "\n" + json.dumps({"d": 4}) + "\n")
    assert tailer.read() == []  # the long complete line is skipped ...
    assert tailer.read() == [{"d": 4}]  # ... and the next one read
    assert tailer.overlong == 2


def test_partial_line_under_the_limit_waits(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    tailer = JsonlTailer(path, max_line=64)
    path.write_text('{"a": ', encoding="utf-8")
    assert tailer.read() == [] and tailer.overlong == 0
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("1}\n")
    assert tailer.read() == [{"a": 1}]
