"""What a save's background writer runs with: a CPU priority that leaves the cores to
the training, and checksums taken as the bytes are written (no torch here).

On a node whose cores all run training (a CPU job, or the data loader's workers and the
host side of a GPU job), a writer thread at the training's priority takes a core's
share from it for as long as it writes: torch's serialisation, the checksums, the page
cache copies. The steps after an async save then ran up to twice as slow on 2 cores,
for the whole write. :func:`yield_cpu` puts the calling thread in Linux's
``SCHED_IDLE`` class (a nice of 19 where that is refused): it runs when a core would
otherwise idle, so the training keeps its cores and the write takes the gaps between
its operations. The price is a longer write when the training leaves no gap; the next
save waits for it (a save never starts while one is in flight).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import zlib
from typing import Any

__all__ = ["Digest", "DigestStream", "yield_cpu"]

_low = threading.local()


def yield_cpu() -> str:
    """Lower the calling thread's CPU priority for good (``SCHED_IDLE``, else nice 19)
    and return the class it runs in now: ``"idle"``, ``"nice"`` or ``"normal"`` (neither
    allowed here). Only for a thread that does nothing else: an unprivileged thread
    cannot raise it again."""
    done = getattr(_low, "policy", None)
    if done is not None:
        return str(done)
    policy = "normal"
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        policy = "idle"
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, tid, 19)  # Linux: this thread's nice
            policy = "nice"
    _low.policy = policy
    return policy


class Digest:
    """A running checksum of the manifest's kind (``crc32`` or ``blake2b``) and the
    number of bytes it has seen."""

    def __init__(self, algo: str) -> None:
        self.algo = algo
        self.size = 0
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

    def hexdigest(self) -> str:
        return self._blake.hexdigest() if self._blake is not None else f"{self._crc:08x}"


class DigestStream:
    """A binary file open for writing that feeds every byte written through a
    :class:`Digest`. It keeps ``fileno`` (DCP fsyncs each file; without one it would
    sync the whole machine)."""

    def __init__(self, fh: Any, digest: Digest) -> None:
        self._fh = fh
        self.digest = digest

    def write(self, data: Any) -> int:
        n = self._fh.write(data)
        self.digest.update(data)
        return int(n)

    def tell(self) -> int:
        return int(self._fh.tell())

    def flush(self) -> None:
        self._fh.flush()

    def fileno(self) -> int:
        return int(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return bool(self._fh.closed)
