"""An async save's data files are checksummed once: the CRC-32 of each tensor's bytes is
the one ``torch.save`` wrote in its zip record, joined to the running checksum; the
checksum of the file stays that of a read of it, and anything that does not look like
such a record is checksummed from the bytes or read back, never guessed."""

from __future__ import annotations

import io
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.checkpoint import CheckpointConfig, CheckpointManager
from rankguard.checkpoint.files import FileEntry, checksum_file
from rankguard.checkpoint.writer import Digest, DigestFile
from rankguard.checkpoint.zipcrc import crc32_combine

pytestmark = pytest.mark.timeout(60)


def test_crc32_combine_is_zlibs() -> None:
    for first, second in ((0, 0), (3, 1), (4096, 17), (5, 1 << 20), (100, (3 << 20) + 7)):
        a, b = os.urandom(first), os.urandom(second)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def _hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes each ``Digest.update`` call was given."""
    seen: list[int] = []
    update = Digest.update

    def counted(self: Digest, data: Any) -> None:
        seen.append(memoryview(data).nbytes)
        update(self, data)

    monkeypatch.setattr(Digest, "update", counted)
    return seen


def _saves(out: Any, tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        torch.save(t, out)


@pytest.mark.parametrize("direct", [True, False])
def test_torch_saves_record_bytes_are_not_checksummed_twice(
    tmp_path: Path, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = [torch.randn(1 << 18), torch.randn(3), torch.empty(0), torch.randn(70_001)]
    hashed = _hashed(monkeypatch)
    out = DigestFile(
        tmp_path / "f", Digest("crc32"), direct=direct, buffer_bytes=1 << 20, zip_crcs=True
    )
    _saves(out, tensors)
    out.close()
    size = (tmp_path / "f").stat().st_size
    assert out.tap is not None and out.tap.joined == 2  # the two of at least 64 KiB
    assert out.digest.complete and out.digest.size == size
    assert out.digest.hexdigest() == checksum_file(tmp_path / "f", "crc32")
    big = 4 * ((1 << 18) + 70_001)
    assert sum(hashed) == size - big


def test_without_torchs_crcs_the_checksum_is_lost_and_the_file_read_back(
    tmp_path: Path,
) -> None:
    """``torch.save`` told not to compute CRC-32s writes 0 in its descriptors."""
    out = DigestFile(tmp_path / "f", Digest("crc32"), zip_crcs=True)
    torch.serialization.set_crc32_options(False)
    try:
        _saves(out, [torch.randn(1 << 17)])
    finally:
        torch.serialization.set_crc32_options(True)
    out.close()
    assert not out.digest.complete
    entry = FileEntry.of(tmp_path, "f", 0, "crc32", digest=out.digest)
    assert entry.checksum == checksum_file(tmp_path / "f", "crc32")


def test_record_bytes_without_their_descriptor_lose_the_checksum(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save(torch.randn(1 << 17), buf)
    raw = buf.getvalue()
    header = raw.rindex(b"PK\x03\x04", 0, raw.index(b"/data/0"))  # the tensor's record
    start = header + 30 + int.from_bytes(raw[header + 26 : header + 28], "little")
    start += int.from_bytes(raw[header + 28 : header + 30], "little")  # past name, extra
    cut = start + 4 * (1 << 17)
    assert raw[cut : cut + 4] == b"PK\x07\x08"
    for tail in (b"", b"PK\x07\x08" + bytes(12), raw[cut : cut + 16] + b"x"):
        out = DigestFile(tmp_path / "f", Digest("crc32"), direct=False, zip_crcs=True)
        out.write(raw[header : header + 30])
        out.write(raw[header + 30 : start])
        out.write(raw[start:cut])
        if tail:
            out.write(tail)
        out.close()
        assert not out.digest.complete, tail


def test_blake2b_is_taken_from_every_byte(tmp_path: Path) -> None:
    out = DigestFile(tmp_path / "f", Digest("blake2b"), zip_crcs=True)
    _saves(out, [torch.randn(1 << 17)])
    out.close()
    assert out.tap is None and out.digest.complete
    assert out.digest.hexdigest() == checksum_file(tmp_path / "f", "blake2b")


def test_an_async_saves_manifest_takes_torchs_crcs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = _hashed(monkeypatch)
    model = torch.nn.Linear(512, 512, bias=False)  # 1 MiB of weight
    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=True)
    with CheckpointManager(config, {"model": model}, session=False) as m:
        m.save(1)
        m.wait()
        assert m.last_committed["persistent"] == 1
    monkeypatch.undo()
    step = tmp_path / "ckpt" / "step_000000001"
    assert (step / "__0_0.distcp").stat().st_size > 1 << 20
    assert sum(hashed) < 1 << 16  # headers and metadata; not the weight's 1 MiB again
    from rankguard.checkpoint import files as ckfiles

    manifest = ckfiles.read_manifest(step)
    ckfiles.verify_files(step, manifest, sorted(manifest.files))
