"""Crash-safe file writes.

Every file another program reads (status, findings, health, summaries) goes through
here: whole-file writes are atomic (temp file in the same directory, fsync, rename,
fsync of the directory) and streams are append-only with one complete JSON object per
line, so a kill -9 at any instant leaves either the old or the new content, never a
torn file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["append_jsonl", "atomic_write_json", "atomic_write_text", "dumps_line", "fsync_dir"]


def dumps_line(obj: Any) -> str:
    """One compact JSON line, newline-terminated."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=False, default=str) + "\n"


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` atomically (tmp + fsync + rename + dir fsync)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """``indent=None`` writes compact JSON (large, frequently rewritten files)."""
    separators = None if indent is not None else (",", ":")
    atomic_write_text(
        path, json.dumps(obj, indent=indent, separators=separators, default=str) + "\n"
    )


def append_jsonl(path: str | os.PathLike[str], records: list[Any], *, fsync: bool = True) -> None:
    """Append complete JSON lines in one write, then fsync.

    A single ``write`` of the whole batch on an ``O_APPEND`` descriptor keeps concurrent
    appenders from interleaving inside a line on local filesystems.
    """
    if not records:
        return
    data = "".join(dumps_line(r) for r in records).encode("utf-8")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
