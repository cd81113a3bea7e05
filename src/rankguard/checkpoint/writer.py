"""Checksums taken as the bytes of a checkpoint file are written (no torch here): the
manifest of an async save needs no second read of what was just written. On the AMD
EPYC VM of the benchmarks zlib's CRC-32 runs at about 0.9 GB/s: reading back a 1.2 GB
checkpoint to checksum it cost more than a second of a core after every save.

:class:`DigestFile` writes a checkpoint file past the page cache (``O_DIRECT``) where
the file system allows it. The CPU of a buffered write is the kernel's work of putting
the bytes in fresh page-cache pages, and it varies with the machine's memory: on the
benchmarks' VM (Linux 6.18, ext4) 1.2 GB written through the page cache cost the
writing thread 1.2-5.8 s of a core, the same bytes written with ``O_DIRECT`` from a
4 MiB aligned buffer 0.27-0.33 s, copy into the buffer included. On a node whose cores
all run training that time is taken from the training while an async save writes.
A file of ``torch.save`` archives (``zip_crcs``) takes each big record's CRC-32 from
its zip writer (:mod:`rankguard.checkpoint.zipcrc`) instead of a second pass.

The copy into the aligned buffer is NumPy's, which releases the interpreter lock: an
async save writes from a thread of the training process, and a copy that held the lock
(a ``memoryview`` assignment, a fifth of the writing thread's CPU) held up the training
thread at each point where it needs the lock (between two operators), for up to a
4 MiB copy each time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import zlib
from typing import Any

import numpy as np

from rankguard.checkpoint.zipcrc import ZipRecordTap, crc32_combine

__all__ = ["Digest", "DigestFile"]

#: from this size on a copy is NumPy's, without the interpreter lock (below it the
#: call costs more than the copy)
GIL_FREE_COPY_BYTES = 64 << 10


def copy_bytes(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` (bytes of equal length); a large copy releases the interpreter
    lock while it runs, so the other threads of the process go on meanwhile."""
    if dst.nbytes < GIL_FREE_COPY_BYTES:
        dst[:] = src
        return
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


class Digest:
    """A running checksum of the manifest's kind (``crc32`` or ``blake2b``) and the
    number of bytes it has seen."""

    def __init__(self, algo: str) -> None:
        self.algo = algo
        self.size = 0
        #: False once a part of the bytes could not be checksummed (the file is then
        #: read back for its checksum)
        self.complete = True
        self._crc = 0
        self._blake = hashlib.blake2b(digest_size=16) if algo == "blake2b" else None

    @classmethod
    def of(cls, data: bytes | memoryview, algo: str) -> Digest:
        digest = cls(algo)
        digest.update(data)
        return digest

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if self._blake is not None:
            self._blake.update(view)
        else:
            self._crc = zlib.crc32(view, self._crc)
        self.size += view.nbytes

    def join(self, crc: int, nbytes: int) -> None:
        """``nbytes`` more bytes whose CRC-32 is ``crc`` (taken by their writer)."""
        assert self._blake is None, self.algo
        self._crc = crc32_combine(self._crc, crc, nbytes)
        self.size += nbytes

    def lose(self) -> None:
        """Bytes went by that this digest did not see."""
        self.complete = False

    def hexdigest(self) -> str:
        return self._blake.hexdigest() if self._blake is not None else f"{self._crc:08x}"


class DigestFile:
    """A new binary file written front to back, every byte fed through a
    :class:`Digest` as it is written, the bulk in whole blocks past the page cache.

    Bytes gather in a page-aligned buffer of ``buffer_bytes`` and go to the file a full
    buffer at a time with ``O_DIRECT`` (no page-cache copy, nothing left in the cache);
    the last part, not a whole number of blocks, is written through the page cache at
    :meth:`close`. With ``direct=False`` all of it goes through the page cache (a file
    read back right after: the read finds it there), as where the file system refuses
    ``O_DIRECT`` (tmpfs; or a write that does not meet its alignment). The file
    is complete at :meth:`close`: :meth:`flush` keeps the buffer (DCP flushes after
    every item; a flush of a part block would end the aligned writes), and whoever
    relies on the file fsyncs it after the close (the manifest's entries do). It keeps
    ``fileno`` (DCP fsyncs each file; without one it would sync the whole machine)."""

    BLOCK = 4096

    def __init__(
        self,
        path: str | os.PathLike[str],
        digest: Digest,
        *,
        direct: bool = True,
        buffer_bytes: int = 4 << 20,
        zip_crcs: bool = False,
    ) -> None:
        assert buffer_bytes > 0 and buffer_bytes % self.BLOCK == 0, buffer_bytes
        self.digest = digest
        #: ``zip_crcs``: the file is ``torch.save`` archives whose writer computes each
        #: record's CRC-32; the digest takes those instead of a second pass (CRC-32 only)
        self.tap = ZipRecordTap(digest) if zip_crcs and digest.algo == "crc32" else None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.direct = False
        direct_flag = getattr(os, "O_DIRECT", 0) if direct else 0
        fd = -1
        if direct_flag:
            try:
                fd = os.open(path, flags | direct_flag, 0o666)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # the file system has no O_DIRECT
                    raise
        if fd < 0:
            fd = os.open(path, flags, 0o666)
        self._fd = fd
        self._buf = mmap.mmap(-1, buffer_bytes)  # page-aligned, as O_DIRECT needs
        self._view = memoryview(self._buf)
        self._fill = 0
        self._pos = 0
        self._closed = False

    def write(self, data: Any) -> int:
        src = memoryview(data).cast("B")
        size, start, room = src.nbytes, 0, len(self._view)
        hash_now = self.tap is None or self.tap.hash_now(src)
        if not self.direct and not self._fill:  # through the page cache: no buffer copy
            if hash_now:
                self.digest.update(src)
            self._write_all(src)
            self._pos += size
            return size
        while start < size:
            take = min(size - start, room - self._fill)
            with self._view[self._fill : self._fill + take] as part:
                copy_bytes(part, src[start : start + take])
                if hash_now:  # from the buffer, while in the cache
                    self.digest.update(part)
            self._fill += take
            start += take
            if self._fill == room:
                self._drain(room)
        self._pos += size
        return size

    def _drain(self, nbytes: int) -> None:
        """Write the buffer's first ``nbytes`` (whole blocks while direct)."""
        with self._view[:nbytes] as chunk:
            self._write_all(chunk)
        self._fill = 0

    def _buffered(self) -> None:
        """Write the rest through the page cache."""
        if self.direct:
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))
            self.direct = False

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """Nothing: the buffer reaches the file in whole blocks, the rest at close."""

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        """Write what the buffer holds and close the file."""
        if self._closed:
            return
        if self.tap is not None:
            self.tap.close()
        try:
            self._write_tail()
        finally:
            self.abandon()

    def _write_tail(self) -> None:
        """The buffer's whole blocks direct, the rest through the page cache."""
        tail = self._fill
        whole = tail - tail % self.BLOCK if self.direct else tail
        if whole:
            self._drain(whole)
        if tail > whole:
            self._buffered()
            with self._view[whole:tail] as part:
                self._write_all(part)
        self._fill = 0

    def _write_all(self, chunk: memoryview) -> None:
        """All of ``chunk`` to the file (through the page cache if the device refuses
        the direct write)."""
        done = 0
        while done < chunk.nbytes:
            try:
                done += os.write(self._fd, chunk[done:])
            except OSError as exc:
                if not (self.direct and exc.errno == errno.EINVAL):
                    raise
                self._buffered()

    def abandon(self) -> None:
        """Close the file without writing what the buffer holds (a failed write)."""
        if self._closed:
            return
        self._closed = True
        os.close(self._fd)
        self._view.release()
        with contextlib.suppress(BufferError):  # a view held by an error's traceback:
            self._buf.close()  # the buffer goes with it

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._closed
