"""The CRC-32 of a tensor's bytes taken from ``torch.save``'s own, not computed twice
(no torch here).

DCP writes every tensor of a checkpoint file with ``torch.save``: a zip archive whose
writer computes the CRC-32 of each record and puts it in the data descriptor that
follows the record's bytes (``torch.load`` never checks it). The manifest's checksum
of the file is the CRC-32 of all its bytes: zlib's CRC-32 of the same bytes a second
time cost the writing thread about 0.3 s of a core per 1.2 GB on the benchmarks' VM, a
third of its CPU. :class:`ZipRecordTap` watches the writes of a file, leaves a
record's bytes out of the running checksum and joins that record's own CRC-32 to it
(:func:`crc32_combine`, zlib's algorithm) when its data descriptor follows with the
same size. Anything else (another layout, a descriptor whose sizes do not match, a
CRC of 0: ``torch.save`` told not to compute it) marks the checksum lost, and the
file is read back for it: never a checksum that was not taken from the bytes.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankguard.checkpoint.writer import Digest

__all__ = ["ZipRecordTap", "crc32_combine"]

_POLY = 0xEDB88320  # CRC-32 (zlib), reflected


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial (reflected bit order)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x^(2^n) modulo the polynomial


def _x8nmodp(nbytes: int) -> int:
    """``x^(8 * nbytes)`` modulo the polynomial."""
    p, k = 1 << 31, 3  # x^0; a byte is 2^3 bits
    while nbytes:
        if nbytes & 1:
            p = _multmodp(_X2N[k & 31], p)
        nbytes >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` of ``A``, ``crc2`` of ``B`` and ``B``'s length
    (zlib's ``crc32_combine``: tens of microseconds, whatever the length)."""
    return _multmodp(_x8nmodp(len2), crc1) ^ (crc2 & 0xFFFFFFFF)


_LOCAL_HEADER = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_HAS_DESCRIPTOR = 0x0008  # general purpose flag bit 3: sizes and CRC after the data
_STORED = 0


class ZipRecordTap:
    """Follows the writes of a file made of ``torch.save`` archives, one write call at
    a time, as PyTorch's zip writer makes them: a record's 30-byte local header, its
    name, its extra field, its bytes in one write, its data descriptor.

    :meth:`hash_now` tells the file whether to feed a write to the digest now (False:
    a record's bytes of at least ``min_bytes``, whose CRC-32 the descriptor brings)."""

    def __init__(self, digest: Digest, *, min_bytes: int = 1 << 16) -> None:
        assert digest.algo == "crc32", digest.algo
        self.digest = digest
        self.min_bytes = min_bytes
        self._skip = -1  # bytes of name and extra field still to come (-1: no header)
        self._pending = -1  # a record's bytes left out of the digest (-1: none)
        self.joined = 0  # records whose CRC-32 was joined

    def hash_now(self, data: memoryview) -> bool:
        size = data.nbytes
        if self._pending >= 0:
            self._close_record(data)
            return True
        if self._skip > 0:
            self._skip -= size
            if self._skip < 0:
                self._skip = -1  # not the layout followed: nothing to leave out
            return True
        if self._skip == 0:
            self._skip = -1
            if size >= self.min_bytes:
                self._pending = size
                return False
            return True
        self._open_record(data)
        return True

    def _open_record(self, data: memoryview) -> None:
        """A stored record's local header with a data descriptor to come."""
        if data.nbytes != 30 or bytes(data[:4]) != _LOCAL_HEADER:
            return
        flags, method = struct.unpack_from("<HH", data, 6)
        name_len, extra_len = struct.unpack_from("<HH", data, 26)
        if flags & _HAS_DESCRIPTOR and method == _STORED:
            self._skip = name_len + extra_len

    def _close_record(self, data: memoryview) -> None:
        """The write after a record's bytes: its descriptor, or the checksum is lost."""
        size, self._pending = self._pending, -1
        crc = None
        if data.nbytes in (16, 24) and bytes(data[:4]) == _DESCRIPTOR:
            fmt = "<III" if data.nbytes == 16 else "<IQQ"
            crc, packed, plain = struct.unpack_from(fmt, data, 4)
            if packed != size or plain != size or crc == 0:
                crc = None
        if crc is None:
            self.digest.lose()
            return
        self.digest.join(crc, size)
        self.joined += 1

    def close(self) -> None:
        """The end of the file: a record's bytes with no descriptor after them lose it."""
        if self._pending >= 0:
            self._pending = -1
            self.digest.lose()
