"""The local (non-persistent) tier: each rank's own shard in a node-local directory,
copied to peer ranks on other nodes, so losing a node loses no checkpoint.

Layout of one node's ``non_persistent_local_ckpt_dir``::

    step_<N>/shard_<owner>_on_<holder>/shard.pt, manifest.json, COMMITTED

``shard_<r>_on_<r>`` is rank r's own copy; ``shard_<r>_on_<h>`` the replica that rank h
holds for it (``replication_factor`` copies in all, at ranks ``r + k * replication_jump``).
A shard is one ``torch.save`` of the rank's whole state (what it would load): no
planner, no collective, one sequential write; the replicas travel as those same bytes
over the checkpoint group. Shards are per-rank: a local checkpoint is loaded only with
the world size that wrote it (the persistent tier reshards).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rankguard.checkpoint.files import (
    COMMIT_MARKER,
    STEP_RE,
    TMP_PREFIX,
    CheckpointError,
    FileEntry,
    checksum_bytes,
    is_real_dir,
    read_manifest,
    read_regular,
    remove_entry,
    replace_dir,
    step_dir_name,
    verify_files,
    write_commit,
    write_manifest,
)
from rankguard.checkpoint.writer import Digest
from rankguard.schema.jsontypes import JsonObject

__all__ = ["LocalStore", "replica_peers"]

SHARD_FILE = "shard.pt"
_SHARD_RE = re.compile(r"^shard_(\d+)_on_(\d+)$")


def replica_peers(rank: int, world: int, factor: int, jump: int) -> tuple[list[int], list[int]]:
    """The ranks this rank sends its shard to, and those it receives one from (a ring
    with stride ``jump``; the rank itself and repeats are left out)."""
    to, frm = [], []
    for k in range(1, factor):
        dst, src = (rank + k * jump) % world, (rank - k * jump) % world
        if dst != rank and dst not in to:
            to.append(dst)
            frm.append(src)
    return to, frm


def serialize(payload: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def deserialize(data: bytes) -> dict[str, Any]:
    out = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(out, dict):
        raise CheckpointError("local shard: not a state mapping")
    return out


class LocalStore:
    """One rank's view of its node-local directory."""

    def __init__(self, root: Path, rank: int, algo: str) -> None:
        self.root = root
        self.rank = rank
        self.algo = algo

    def folder(self, step: int, owner: int) -> Path:
        return self.root / step_dir_name(step) / f"shard_{owner}_on_{self.rank}"

    def write(self, step: int, owner: int, data: bytes, meta: JsonObject) -> Path:
        """Write ``owner``'s shard bytes as held by this rank: temp folder, fsync,
        manifest, rename, marker."""
        final = self.folder(step, owner)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            with open(tmp / SHARD_FILE, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            held = Digest.of(data, self.algo)  # from memory: nothing read back
            entry = FileEntry.of(tmp, SHARD_FILE, owner, self.algo, fsync=False, digest=held)
            info: JsonObject = {**meta, "owner": owner, "holder": self.rank}
            digest = write_manifest(tmp, step, [entry], info, self.algo)
            replace_dir(tmp, final)
            write_commit(final, step, digest, info)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def holdings(self, world: int) -> dict[int, list[int]]:
        """``{step: [owners]}`` of the committed shards this rank holds for a job of
        ``world`` ranks, with the manifest's sizes (the checksum is checked when the shard
        is read: a mismatch then makes the whole step fall back)."""
        out: dict[int, list[int]] = {}
        for step, folder, owner in self._folders():
            try:
                manifest = read_manifest(folder)
                if manifest.doc.get("world_size") != world:
                    continue
                verify_files(folder, manifest, list(manifest.files), checksum=False)
            except CheckpointError:
                continue
            out.setdefault(step, []).append(owner)
        return out

    def read(self, step: int, owner: int) -> bytes:
        """The shard's bytes, read once and checked against the manifest in memory."""
        folder = self.folder(step, owner)
        manifest = read_manifest(folder)
        want = manifest.files.get(SHARD_FILE)
        path = folder / SHARD_FILE
        if want is None:
            raise CheckpointError(f"{folder / 'manifest.json'}: no entry for {SHARD_FILE}")
        try:
            size = os.lstat(path).st_size
            data = read_regular(path, want.size) if size == want.size else b""
        except OSError as exc:
            raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
        if size != want.size or len(data) != want.size:
            raise CheckpointError(
                f"{path}: {size} bytes, the manifest says {want.size} (torn or truncated)"
            )
        got = checksum_bytes(data, manifest.checksum)
        if got != want.checksum:
            raise CheckpointError(
                f"{path}: checksum {got}, the manifest says {want.checksum} (corrupt)"
            )
        return data

    def _folders(self) -> list[tuple[int, Path, int]]:
        out: list[tuple[int, Path, int]] = []
        try:
            steps = os.listdir(self.root)
        except FileNotFoundError:
            return out
        for name in steps:
            m = STEP_RE.match(name)
            if not m or not is_real_dir(self.root / name):
                continue  # a linked step is not this node's: never read nor deleted
            try:
                shards = os.listdir(self.root / name)
            except OSError:
                continue
            for shard in shards:
                s = _SHARD_RE.match(shard)
                path = self.root / name / shard
                if s and int(s.group(2)) == self.rank and is_real_dir(path):
                    out.append((int(m.group(1)), path, int(s.group(1))))
        return out

    def _clear_temporaries(self) -> None:
        """This rank's temporary folders a killed writer left (none is in flight: the
        caller runs after its own write)."""
        mark = f"_on_{self.rank}."
        try:
            steps = [n for n in os.listdir(self.root) if STEP_RE.match(n)]
        except FileNotFoundError:
            return
        for name in steps:
            if not is_real_dir(self.root / name):
                continue
            with contextlib.suppress(OSError):
                for entry in os.listdir(self.root / name):
                    if entry.startswith(TMP_PREFIX) and mark in entry:
                        remove_entry(self.root / name / entry)

    def prune(self, keep: int, protect: set[int]) -> None:
        """Keep this rank's folders of the newest ``keep`` steps (-1: all); never a step
        in ``protect``. Empty step directories go too. Symbolic links are never followed
        (a linked step or shard is neither counted nor deleted)."""
        self._clear_temporaries()
        if keep < 0:
            return
        mine = self._folders()
        committed = sorted({s for s, f, _ in mine if (f / COMMIT_MARKER).exists()}, reverse=True)
        keep_steps = set(committed[:keep]) | protect
        newest = committed[0] if committed else None
        for step, folder, _ in mine:
            if step in keep_steps or (newest is not None and step > newest):
                continue
            remove_entry(folder)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()
