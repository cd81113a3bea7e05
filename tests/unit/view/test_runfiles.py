"""Reading findings.jsonl from its end: long and over-long lines, linear cost."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rankguard.view.runfiles import MAX_LINE, read_findings


def _write(path: Path, *lines: bytes) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def test_over_long_line_is_skipped_and_its_neighbours_read(tmp_path: Path) -> None:
    path = tmp_path / "findings.jsonl"
    huge = json.dumps({"message": "x" * (MAX_LINE + 10)}).encode()
    _write(path, b'{"n": 1}', huge, b'{"n": 2}')
    assert read_findings(path, 10) == [{"n": 1}, {"n": 2}]
    _write(path, huge, b'{"n": 3}')  # at the very start of the file too
    assert read_findings(path, 10) == [{"n": 3}]


def test_a_long_line_costs_its_length_not_its_square(tmp_path: Path) -> None:
    path = tmp_path / "findings.jsonl"
    long = json.dumps({"message": "y" * (6 << 20)}).encode()  # 6 MiB: 96 chunks
    _write(path, b'{"n": 0}', long, b'{"n": 1}')
    t0 = time.perf_counter()
    found = read_findings(path, 10)
    elapsed = time.perf_counter() - t0
    assert [f.get("n") for f in found] == [0, None, 1]
    assert len(found[1]["message"]) == 6 << 20
    assert elapsed < 2.0, elapsed  # joined once: 0.02 s here (re-joining per chunk: 0.33 s)


def test_limit_and_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "findings.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\nnot json\n{"n": 3}\n{"n": ')
    assert read_findings(path, 2) == [{"n": 2}, {"n": 3}]
    assert read_findings(path, 10) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert read_findings(tmp_path / "missing.jsonl", 5) == []
