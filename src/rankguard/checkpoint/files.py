"""Checkpoint directories on disk: names, checksums, manifests, commit markers, retention
and the directory lock. No torch import, no collective: pure file logic.

A checkpoint is a directory ``step_<N>`` that holds its data files, ``manifest.json``
(every file's size and checksum) and, last, ``COMMITTED`` (the manifest's own checksum).
It is written as ``.tmp_step_<N>.<nonce>``, every file fsynced, renamed into place, then
marked. A directory without the marker, or whose files do not match the manifest, is
never loaded.

Checksum: zlib's CRC-32 (standard library, releases the GIL, measured 4.1 GB/s against
0.8 GB/s for BLAKE2b and 1.5 GB/s for SHA-256 on the same host): it detects torn and
truncated files and bit rot. Neither it nor BLAKE2b detects tampering: the checksums sit
unkeyed beside the data, in a manifest the same writer can rewrite. What keeps a planted
checkpoint out is :func:`root_problem` (who may write the directory) and a load that
runs no code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankguard.checkpoint.writer import Digest
from rankguard.schema.coerce import as_int
from rankguard.schema.jsontypes import JsonObject
from rankguard.util.fs import atomic_write_json, fsync_dir, owner_name
from rankguard.util.procs import pid_running

__all__ = [
    "COMMIT_MARKER",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "CheckpointError",
    "DirLock",
    "FileEntry",
    "Manifest",
    "checksum_file",
    "committed_steps",
    "fsync_file",
    "is_real_dir",
    "read_manifest",
    "read_regular",
    "remove_entry",
    "root_problem",
    "step_dir_name",
    "verify_files",
    "write_commit",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
COMMIT_MARKER = "COMMITTED"
LOCK_FILE = ".rankguard_checkpoint.lock"
TMP_PREFIX = ".tmp_"
STEP_RE = re.compile(r"^step_(\d{9,})$")
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the path and the cause."""


def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checksum_file(path: Path, algo: str) -> str:
    """Hex checksum of ``path`` (``crc32`` or ``blake2b``), read in 8 MiB chunks."""
    with open(path, "rb", buffering=0) as fh:
        if algo == "crc32":
            crc = 0
            while chunk := fh.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
            return f"{crc:08x}"
        digest = hashlib.blake2b(digest_size=16)
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()


def checksum_bytes(data: bytes | memoryview, algo: str) -> str:
    if algo == "crc32":
        return f"{zlib.crc32(data):08x}"
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint, size, checksum and
    the rank that wrote it."""

    name: str
    size: int
    checksum: str
    rank: int

    def to_dict(self) -> JsonObject:
        return {"size": self.size, "checksum": self.checksum, "rank": self.rank}

    @classmethod
    def of(
        cls,
        root: Path,
        name: str,
        rank: int,
        algo: str,
        *,
        fsync: bool = True,
        digest: Digest | None = None,
    ) -> FileEntry:
        """The entry of ``root / name``; its checksum is ``digest``'s (taken by the
        writer from the bytes it wrote) when that saw every byte the file holds, else
        read back."""
        path = root / name
        if fsync:
            fsync_file(path)
        size = path.stat().st_size
        if digest is not None and digest.complete and digest.algo == algo and digest.size == size:
            return cls(name, size, digest.hexdigest(), rank)
        return cls(name, size, checksum_file(path, algo), rank)


def write_manifest(
    directory: Path, step: int, entries: list[FileEntry], meta: JsonObject, algo: str
) -> str:
    """Write ``manifest.json`` (fsynced) and return its checksum (for the marker)."""
    doc: JsonObject = {
        "format_version": 1,
        "step": step,
        "checksum": algo,
        **meta,
        "files": {e.name: e.to_dict() for e in sorted(entries, key=lambda e: e.name)},
    }
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    path = directory / MANIFEST_FILE
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return checksum_bytes(data, algo)


def write_commit(directory: Path, step: int, manifest_checksum: str, meta: JsonObject) -> None:
    """The commit marker, written last (atomically) inside the renamed directory."""
    atomic_write_json(
        directory / COMMIT_MARKER,
        {"step": step, "manifest_checksum": manifest_checksum, **meta},
    )
    fsync_dir(directory)


_MAX_META = 64 << 20  # the largest manifest or marker read (a manifest lists every file)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``; OSError for a link, a
    device or a FIFO (never opened for reading: ``/dev/zero`` would not end) and for a
    larger file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path}: {st.st_size} bytes, more than {limit}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(st.st_size)  # a file that grew since is torn: its size says so
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Manifest:
    """A verified ``manifest.json``: its checksum algorithm, its files by name (size and
    checksum checked to be there; ``rank`` -1 when it names none) and the whole document
    as read (the fields its writer added, ``world_size`` and ``format``, narrowed by
    whoever reads them)."""

    checksum: str
    files: Mapping[str, FileEntry]
    doc: JsonObject


def read_manifest(directory: Path) -> Manifest:
    """The verified manifest of a committed checkpoint; CheckpointError otherwise."""
    marker_path = directory / COMMIT_MARKER
    try:
        marker = json.loads(read_regular(marker_path, _MAX_META))
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: not committed (no {COMMIT_MARKER})") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{marker_path}: unreadable commit marker: {exc}") from None
    try:
        data = read_regular(directory / MANIFEST_FILE, _MAX_META)
        manifest = json.loads(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{directory / MANIFEST_FILE}: unreadable: {exc}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{directory / MANIFEST_FILE}: not an object")
    algo = manifest.get("checksum", "crc32") if isinstance(manifest, dict) else "crc32"
    if not isinstance(marker, dict) or marker.get("manifest_checksum") != checksum_bytes(
        data, algo
    ):
        raise CheckpointError(f"{directory}: manifest does not match its commit marker")
    if not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{directory / MANIFEST_FILE}: no file list")
    files: dict[str, FileEntry] = {}
    for name, entry in manifest["files"].items():
        problem = _entry_problem(name, entry)
        if problem is not None:
            raise CheckpointError(f"{directory / MANIFEST_FILE}: file {name!r:.80}: {problem}")
        rank = as_int(entry.get("rank"))
        files[name] = FileEntry(
            name, entry["size"], entry["checksum"], -1 if rank is None else rank
        )
    return Manifest(str(algo), files, manifest)


def _entry_problem(name: str, entry: Any) -> str | None:
    """Why a manifest entry cannot name a file of its checkpoint, or None."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return "not a relative path"
    if any(part in ("", ".", "..") for part in parts):
        return "leaves the checkpoint directory"
    if not isinstance(entry, dict):
        return "no size and checksum"
    size, checksum = entry.get("size"), entry.get("checksum")
    if type(size) is not int or size < 0 or not isinstance(checksum, str):
        return "no size and checksum"
    return None


def verify_files(
    directory: Path, manifest: Manifest, names: list[str], *, checksum: bool = True
) -> None:
    """Check size and (``checksum``) checksum of ``names`` (some of the manifest's
    files), each a regular file (never read through a link: a device would not end)."""
    algo = manifest.checksum
    for name in names:
        want = manifest.files[name]
        path = directory / name
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise CheckpointError(f"{path}: missing ({exc.strerror})") from None
        if not stat.S_ISREG(st.st_mode):  # a link, a device (/dev/zero), a directory
            raise CheckpointError(f"{path}: not a regular file")
        size = st.st_size
        if size != want.size:
            raise CheckpointError(
                f"{path}: {size} bytes, the manifest says {want.size} (torn or truncated)"
            )
        if not checksum:
            continue
        got = checksum_file(path, algo)
        if got != want.checksum:
            raise CheckpointError(
                f"{path}: {algo} {got}, the manifest says {want.checksum} (corrupt)"
            )


def committed_steps(root: Path, *, links: bool = False) -> list[tuple[int, Path]]:
    """``(step, dir)`` of every directory that carries a commit marker, newest first
    (the marker says committed; verification is the reader's next step). A step that is
    a symbolic link counts only with ``links`` (a load may read through one; retention
    never follows one out of the job)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = STEP_RE.match(name)
        if not m or not (links or is_real_dir(root / name)):
            continue
        if (root / name / COMMIT_MARKER).exists():
            out.append((int(m.group(1)), root / name))
    return sorted(out, reverse=True)


def is_real_dir(path: Path) -> bool:
    """A directory, not a symbolic link to one (``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_entry(path: Path) -> None:
    """Delete a checkpoint directory without following links: a symbolic link is
    unlinked itself; a real directory loses its commit marker first (a half-deleted
    checkpoint is never taken for a good one), then the rest."""
    if not is_real_dir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    with contextlib.suppress(OSError):
        (path / COMMIT_MARKER).unlink(missing_ok=True)  # a link: only the link goes
    shutil.rmtree(path, ignore_errors=True)  # rmtree never follows links inside


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final`` (moving an older ``final`` aside first), fsync parent."""
    trash = None
    if final.exists():
        trash = final.with_name(f"{TMP_PREFIX}old_{final.name}.{os.getpid()}")
        os.replace(final, trash)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def prune(root: Path, keep: int, *, protect: set[Path], keep_tmp_prefix: str | None) -> list[Path]:
    """Retention: delete committed checkpoints beyond the newest ``keep`` (-1: none),
    uncommitted ``step_*`` directories older than the newest committed one, and stale
    temporary directories (not ``keep_tmp_prefix``, the writer's own). Never a path in
    ``protect``, never through a symbolic link (a linked step is neither counted nor
    deleted; a linked temporary loses only the link). Returns what was removed."""
    removed: list[Path] = []
    committed = committed_steps(root)
    doomed = [d for _, d in committed[keep:]] if keep >= 0 else []
    newest = committed[0][0] if committed else None
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for name in names:
        m = STEP_RE.match(name)
        path = root / name
        if m and newest is not None and int(m.group(1)) < newest:
            # a step that links elsewhere (another run's checkpoint) is not this job's
            if is_real_dir(path) and not (path / COMMIT_MARKER).exists():
                doomed.append(path)
        elif name.startswith(TMP_PREFIX) and (
            keep_tmp_prefix is None or not name.startswith(keep_tmp_prefix)
        ):
            doomed.append(path)
    for path in doomed:
        if path in protect:
            continue
        remove_entry(path)
        removed.append(path)
    return removed


def root_problem(directory: Path, *, owner: bool = True) -> str | None:
    """Why checkpoints in ``directory`` cannot be trusted, or None: it belongs to another
    user (with ``owner``) or every user may write into it; either could plant a
    checkpoint that this job then loads (a manifest and its marker are no defence: the
    same user rewrites them). A missing directory is fine (it is created as ours)."""
    try:
        st = os.stat(directory)  # follows a symlink: the directory actually used
    except (FileNotFoundError, NotADirectoryError):
        return None  # the writer's probe says why it cannot be created
    except OSError as exc:
        return f"{directory}: cannot inspect it ({exc.strerror or exc})"
    if owner and st.st_uid != os.getuid():
        return (
            f"{directory} belongs to {owner_name(st.st_uid)} (uid {st.st_uid}), not to this "
            f"user (uid {os.getuid()}): refusing to use it for checkpoints; choose a "
            "directory of your own"
        )
    if st.st_mode & stat.S_IWOTH:
        return (
            f"{directory} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): "
            "anyone could plant a checkpoint there; remove that permission (chmod o-w) or "
            "choose another directory"
        )
    return None


def probe_writable(directory: Path) -> str | None:
    """None if ``directory`` can be created, is this user's (:func:`root_problem`) and
    can be written, else why not."""
    problem = root_problem(directory)
    if problem is not None:
        return problem
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".rankguard_probe.{socket.gethostname()}.{os.getpid()}"
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as exc:
        return f"{directory}: cannot write there: {exc.strerror or exc}"
    return None


class DirLock:
    """Keeps two jobs out of one checkpoint directory: ``.rankguard_checkpoint.lock``
    names the owner job (host, pid). The same job (an in-job restart, a requeue with the
    same run id) takes it over; a dead owner on this host is taken over with a warning;
    any other owner is refused."""

    def __init__(self, directory: Path, job: str) -> None:
        self.path = directory / LOCK_FILE
        self.job = job
        self.took_over: JsonObject | None = None

    def acquire(self) -> None:
        me = {"job": self.job, "host": socket.gethostname(), "pid": os.getpid()}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = self._owner()
            if owner is not None and owner.get("job") != self.job:
                same_host = owner.get("host") == me["host"]
                pid = owner.get("pid")
                if not (same_host and isinstance(pid, int) and not pid_running(pid)):
                    raise CheckpointError(
                        f"{self.path.parent}: in use by job {owner.get('job')!r} "
                        f"(host {owner.get('host')}, pid {owner.get('pid')}); this job is "
                        f"{self.job!r}. Use another directory, or delete {self.path} if "
                        "that job is gone"
                    ) from None
                self.took_over = owner
            atomic_write_json(self.path, me)
            return
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
            fh.flush()
            os.fsync(fh.fileno())

    def took_over_line(self) -> str | None:
        """What to say when :meth:`acquire` took over a dead job's lock, else None."""
        if self.took_over is None:
            return None
        return (
            f"{self.path}: took over the lock of job {self.took_over.get('job')!r} "
            f"(pid {self.took_over.get('pid')} on this host is gone)"
        )

    def _owner(self) -> JsonObject | None:
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # torn lock: ours to take
        return owner if isinstance(owner, dict) else None

    def release(self) -> None:
        owner = self._owner()
        if owner is not None and owner.get("job") == self.job and owner.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink()
