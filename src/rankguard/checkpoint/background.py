"""DCP's file writer for a save written in the background (imported at the first async
save: DCP is not imported before a rank's first checkpoint).

:class:`BackgroundWriter` is DCP's ``FileSystemWriter`` (every file fsynced) whose
``write_data`` runs, in DCP's checkpoint process, at the priority that leaves the
cores to the training (``SCHED_IDLE`` for at most ``idle_max_s`` seconds,
:class:`~rankguard.checkpoint.idlewrite.IdleWindow`; for good,
:func:`rankguard.util.cpuprio.yield_cpu`, where the process may not raise it back),
and whose files are written past the page cache where the file system allows it
(:class:`~rankguard.checkpoint.writer.DigestFile`: a fraction of the CPU of a buffered
write) and checksummed from the bytes as they are written, so the manifest needs no
second read of the checkpoint
(:meth:`BackgroundWriter.checksums`; a writer in DCP's checkpoint process keeps its
checksums there: those files are read back). In the training process (DCP's thread)
the write keeps the training's priority, or with ``priority="idle"`` runs in
``SCHED_IDLE`` for at most ``idle_max_s`` seconds
(:class:`~rankguard.checkpoint.idlewrite.IdleWindow`). A blocking save uses DCP's
plain writer: it runs in the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

from torch import serialization
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from rankguard.checkpoint import idlewrite
from rankguard.checkpoint.idlewrite import IdleOutcome, IdleWindow
from rankguard.checkpoint.writer import Digest, DigestFile
from rankguard.util.cpuprio import yield_cpu

__all__ = ["BackgroundWriter"]


class _DigestFileSystem(FileSystem):
    """DCP's local file system; every file it opens for writing is a
    :class:`DigestFile` (direct writes, checksummed as written)."""

    def __init__(self, algo: str) -> None:
        super().__init__()
        self.algo = algo
        self.digests: dict[str, Digest] = {}  # by file name; one writer per file
        #: past the page cache (off in DCP's checkpoint process: the training process
        #: reads those files back to checksum them, from the page cache)
        self.direct = True

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if "w" not in mode or "b" not in mode:
            with super().create_stream(path, mode) as plain:
                yield plain
            return
        digest = Digest(self.algo)
        # DCP writes each tensor with torch.save, whose zip writer takes every record's
        # CRC-32 (unless told not to): the digest joins those, no second pass
        zip_crcs = serialization.get_crc32_options()
        out = DigestFile(path, digest, direct=self.direct, zip_crcs=zip_crcs)
        try:
            yield out
        except BaseException:
            out.abandon()  # a failed save: its directory is removed
            raise
        out.close()
        self.digests[Path(path).name] = digest

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # DCP writes .metadata as a temp file, then renames
        digest = self.digests.pop(Path(path).name, None)
        if digest is not None:
            self.digests[Path(new_path).name] = digest


class BackgroundWriter(FileSystemWriter):
    """``FileSystemWriter`` for an async save: writes at low CPU priority, checksums
    as it writes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        algo: str = "crc32",
        *,
        priority: str = "normal",
        idle_max_s: float = 30.0,
    ) -> None:
        super().__init__(path, sync_files=True)
        self.fs = _DigestFileSystem(algo)
        self._owner_pid = os.getpid()  # the training process that built it
        self.priority = priority
        self.idle_max_s = idle_max_s
        #: how the write's idle window ended (None: no window, the training's priority)
        self.idle: IdleWindow | None = None
        self._idle_lock = threading.Lock()
        self._waited = False  # the training waits for this write: no idle window

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.in_checkpoint_process():
            fs = self.fs
            assert isinstance(fs, _DigestFileSystem)
            fs.direct = False
            # DCP's checkpoint process: no interpreter lock shared with the training.
            # Looked up in idlewrite at each write, as IdleWindow does, not bound at
            # this module's import: the write and its window have one answer
            window = IdleWindow(self.idle_max_s) if idlewrite.restore_permitted() else None
            if window is None:
                yield_cpu()  # for good: this process may not raise it back
                return super().write_data(plan, planner)
            with window:
                return super().write_data(plan, planner)
        if self.priority == "idle":
            # DCP's thread writes the whole file list in this call (one writer thread)
            with self._idle_lock:
                window = None if self._waited else IdleWindow(self.idle_max_s)
                if window is not None:
                    window.__enter__()
                self.idle = window
            try:
                return super().write_data(plan, planner)
            finally:
                if window is not None:
                    window.__exit__(None, None, None)
        return super().write_data(plan, planner)

    def __getstate__(self) -> dict[str, Any]:
        """Sent to DCP's checkpoint process without its lock (never open there)."""
        state = dict(self.__dict__)
        del state["_idle_lock"]
        state["idle"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._idle_lock = threading.Lock()

    def end_idle(self) -> None:
        """The training waits for this write: it runs at the training's priority from
        now on (an idle window open is ended; none opens later)."""
        with self._idle_lock:
            self._waited = True
            if self.idle is not None:
                self.idle.end()

    def idle_note(self) -> tuple[int, str] | None:
        """The log level and line on the write's priority, when the idle window did not
        hold the whole write (``logging.WARNING``: the setting has no effect here)."""
        window = self.idle
        if window is None or window.outcome in (IdleOutcome.IDLE, IdleOutcome.WAITED):
            return None
        if window.outcome is IdleOutcome.BOUNDED:
            return logging.INFO, (
                f"the write ran {window.idle_s:.1f} s in SCHED_IDLE (the training left "
                "too few idle cores), then at the training's priority "
                f"(checkpoint.async_idle_max_s={self.idle_max_s:g})"
            )
        return logging.WARNING, (
            "checkpoint.async_write_priority=idle has NO effect: this process may not "
            "raise a thread back from SCHED_IDLE (needs CAP_SYS_NICE or RLIMIT_NICE); "
            "the write ran at the training's priority"
        )

    def in_checkpoint_process(self) -> bool:
        """Whether this runs in DCP's checkpoint process (``async_checkpointer_type:
        process``), whose write runs at idle priority, bounded; in the training process
        (DCP's thread) it keeps the training's unless ``priority="idle"``."""
        return os.getpid() != self._owner_pid

    def checksums(self) -> dict[str, Digest]:
        """``{file name: digest}`` of the files this writer wrote in this process."""
        fs = self.fs
        assert isinstance(fs, _DigestFileSystem)
        return dict(fs.digests)
