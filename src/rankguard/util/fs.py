"""Crash-safe file writes.

Every file another program reads (status, findings, health, summaries) goes through
here: whole-file writes are atomic (temp file in the same directory, fsync, rename,
fsync of the directory) and streams are append-only with one complete JSON object per
line, so a kill -9 at any instant leaves either the old or the new content, never a
torn file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

__all__ = [
    "ForeignPathError",
    "QueuedJsonl",
    "append_bytes",
    "append_jsonl",
    "atomic_write_json",
    "atomic_write_text",
    "create_exclusive",
    "dumps_line",
    "fsync_dir",
    "open_append",
    "owned_subdir",
    "owner_name",
    "write_all",
    "write_new_then_replace",
]

logger = logging.getLogger(__name__)


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


def _keep_mode(fd: int, target: Path) -> None:
    """A replacement file gets the mode of the file it replaces, else 0644 (``mkstemp``
    makes 0600: other users' tools could no longer read status files)."""
    try:
        mode = os.stat(target).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    os.fchmod(fd, mode)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` atomically (tmp + fsync + rename + dir fsync)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        _keep_mode(fd, target)
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
    if records:
        append_bytes(path, "".join(dumps_line(r) for r in records).encode("utf-8"), fsync=fsync)


def append_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Append complete lines already encoded (see ``append_jsonl``).

    Never through a symbolic link (``O_NOFOLLOW``: a planted link cannot make rankguard
    append to another file). A short write is continued; a failed one (a full disk) is
    cut back to where this append started, so the file never keeps a torn line that the
    next append would join, and the error is raised for the caller to keep the lines.
    Meant for files with one writer (each rank's heartbeats, node 0's run files).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, _APPEND_FLAGS, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def open_append(path: str | os.PathLike[str]) -> int:
    """A descriptor for appending to ``path`` (created 0644), never through a link."""
    return os.open(path, _APPEND_FLAGS, 0o644)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``, continuing after short writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[n:]


def rotate_jsonl(path: str | os.PathLike[str], first: bytes) -> None:
    """Move a full JSONL file to ``<path>.1`` (replacing an older one) and start ``path``
    anew with ``first`` (complete lines, e.g. the writer's start record).

    ``path`` exists and holds valid lines at every instant (a kill -9 at any point
    leaves either the old file or the new one there): the new file is written aside,
    the old one gets its second name by a hard link, and a rename swaps the new one in.
    A reader that follows ``path`` by inode sees a new file and starts from its top.
    """
    target = Path(path)
    older = target.with_name(target.name + ".1")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        _keep_mode(fd, target)
        with os.fdopen(fd, "wb") as fh:
            fh.write(first)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(older)
        os.link(target, older)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


class QueuedJsonl:
    """An append-only JSONL file that loses no line to a failed write (a full disk).

    :meth:`append` queues the lines, then writes everything queued, oldest first, in one
    :func:`append_bytes`; lines that could not be written stay queued, in order, for the
    next :meth:`append` or :meth:`flush` (the monitor calls one at every scan). Never
    raises for a write error: it is counted (``errors``) and kept (``last_error``). The
    bound applies only to what a failed write leaves: a batch of any size is written
    whole on a healthy disk; after a failure at most ``max_pending`` lines wait, beyond
    that the newest are dropped and counted (``dropped``), since the first lines of a
    fault are its cause and the later ones mostly echoes. Thread-safe.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_pending: int = 10_000, fsync: bool = True
    ) -> None:
        if max_pending <= 0:
            raise ValueError(f"max_pending: must be > 0, got {max_pending}")
        self.path = Path(path)
        self.max_pending = max_pending
        self.fsync = fsync
        self.errors = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._pending: deque[bytes] = deque()
        self._failing = False
        self._lock = threading.Lock()

    @property
    def unwritten(self) -> int:
        """Lines waiting to be written."""
        return len(self._pending)

    def append(self, records: list[Any]) -> bool:
        """Queue ``records`` after any unwritten lines, then try to write them all.
        True when nothing is left unwritten."""
        with self._lock:
            self._pending.extend(dumps_line(record).encode("utf-8") for record in records)
            return self._flush()

    def flush(self) -> bool:
        """Write the queued lines, if any. True when nothing is left unwritten."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        if not self._pending:
            return True
        n = len(self._pending)
        try:
            append_bytes(self.path, b"".join(self._pending), fsync=self.fsync)
        except OSError as exc:
            self.errors += 1
            self.last_error = f"{self.path.name}: {exc}"
            if not self._failing:
                logger.error(
                    "rankguard: cannot append to %s (%d line(s) kept, retried): %s",
                    self.path,
                    n,
                    exc,
                )
            self._failing = True
            excess = len(self._pending) - self.max_pending
            if excess > 0:  # keep the oldest: a fault's first lines are its cause
                for _ in range(excess):
                    self._pending.pop()
                self.dropped += excess
            return False
        self._pending.clear()
        if self._failing:
            logger.warning("rankguard: %s written again (%d queued line(s))", self.path, n)
        self._failing = False
        return True


def owner_name(uid: int) -> str:
    """The user name of ``uid``, else the number."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


class ForeignPathError(OSError):
    """A file or folder rankguard reads or writes is not this user's own (another owner,
    a symbolic link, not the kind expected)."""


def owned_subdir(parent: str | os.PathLike[str], name: str) -> Path:
    """``parent/name``, created with ``parent``'s own mode (the run directory's
    ``run_dir_mode``, whatever the umask) or checked when it exists: a real directory
    (not a symbolic link) owned by this user, its mode no wider than ``parent``'s
    (narrowed if it is). :class:`ForeignPathError` otherwise."""
    base = Path(parent)
    path = base / name
    mode = os.stat(base).st_mode & 0o777
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    else:
        os.chmod(path, mode)  # the umask may have taken bits away
        return path
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ForeignPathError(f"{path} is not a directory (a symbolic link or a file)")
    if st.st_uid != os.getuid():
        raise ForeignPathError(
            f"{path} belongs to {owner_name(st.st_uid)} (uid {st.st_uid}), not to this user"
        )
    if st.st_mode & 0o777 & ~mode:
        os.chmod(path, st.st_mode & 0o777 & mode)
    return path


def create_exclusive(path: str | os.PathLike[str], mode: int = 0o640) -> int:
    """A new file opened to write, never an existing one nor through a symbolic link
    (``O_CREAT|O_EXCL|O_NOFOLLOW``): a name planted in advance fails (FileExistsError)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)


def write_new_then_replace(path: str | os.PathLike[str], data: bytes, mode: int = 0o640) -> None:
    """Replace ``path`` with ``data``: written to a new temporary file of an unguessable
    name beside it (:func:`create_exclusive`), then renamed over ``path`` (a rename
    replaces a symbolic link planted at ``path``, never follows it)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = create_exclusive(tmp, mode)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
