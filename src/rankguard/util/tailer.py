"""Incremental JSONL reading by byte offset.

A heartbeat file is appended to by a process that may be killed at any instant, so the
tailer must tolerate a partial last line (left for the next read), malformed lines
(skipped and counted, one nested too deeply for the parser included), a line longer
than ``max_line`` bytes (skipped up to its end and counted, so one runaway line never
stops the file) and truncation or replacement
(restart from the beginning). A file that has not grown costs one ``stat``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonlTailer"]

MAX_LINE = 8 << 20  # bytes; also the most read in one call (a backlog takes several)


class JsonlTailer:
    __slots__ = (
        "_ino",
        "_skipping",
        "malformed",
        "max_line",
        "offset",
        "overlong",
        "path",
        "truncations",
    )

    def __init__(self, path: str | os.PathLike[str], *, max_line: int = MAX_LINE) -> None:
        self.path = Path(path)
        self.max_line = max_line
        self.offset = 0
        self.malformed = 0
        self.overlong = 0
        self.truncations = 0
        self._ino: int | None = None
        self._skipping = False  # inside a line longer than max_line: drop to its end

    def read(self, size: int | None = None, ino: int | None = None) -> list[dict[str, Any]]:
        """New complete records since the last call (``size``/``ino``: a known stat)."""
        if size is None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._gone()
                return []
            size, ino = st.st_size, st.st_ino
        if ino is not None:
            if self._ino is not None and ino != self._ino:
                self._restart()
            self._ino = ino
        if size < self.offset:
            self._restart()
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(min(size - self.offset, self.max_line))
                while self._skipping and data:  # the rest of an over-long line
                    cut = data.find(b"\n")
                    if cut < 0:
                        self.offset += len(data)
                        data = fh.read(min(size - self.offset, self.max_line))
                        continue
                    self.offset += cut + 1
                    data = data[cut + 1 :]
                    self._skipping = False
        except FileNotFoundError:
            self._gone()
            return []
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= self.max_line:  # no line end within max_line: skip that line
                self.overlong += 1
                self.offset += len(data)
                self._skipping = True
            return []  # else only a partial line so far
        self.offset += end + 1
        records: list[dict[str, Any]] = []
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply
                self.malformed += 1
                continue
            if isinstance(obj, dict):
                records.append(obj)
            else:
                self.malformed += 1
        return records

    def _restart(self) -> None:
        self.offset = 0
        self._skipping = False
        self.truncations += 1

    def _gone(self) -> None:
        # A file re-created at this path is a new file, even with a recycled inode.
        if self.offset or self._ino is not None:
            self._restart()
            self._ino = None
