"""Incremental JSONL reading by byte offset.

A heartbeat file is appended to by a process that may be killed at any instant, so the
tailer must tolerate a partial last line (left for the next read), malformed lines
(skipped and counted) and truncation or replacement (restart from the beginning).
A file that has not grown costs one ``stat``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonlTailer"]

_MAX_READ = 8 << 20  # bytes per read call; a huge backlog is consumed over several scans


class JsonlTailer:
    __slots__ = ("_ino", "malformed", "offset", "path", "truncations")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.malformed = 0
        self.truncations = 0
        self._ino: int | None = None

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
                self.offset = 0
                self.truncations += 1
            self._ino = ino
        if size < self.offset:
            self.offset = 0
            self.truncations += 1
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(min(size - self.offset, _MAX_READ))
        except FileNotFoundError:
            self._gone()
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []  # only a partial line so far
        self.offset += end + 1
        records: list[dict[str, Any]] = []
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.malformed += 1
                continue
            if isinstance(obj, dict):
                records.append(obj)
            else:
                self.malformed += 1
        return records

    def _gone(self) -> None:
        # A file re-created at this path is a new file, even with a recycled inode.
        if self.offset or self._ino is not None:
            self.offset = 0
            self._ino = None
            self.truncations += 1
