"""The persistent tier: the shared ``checkpoint.save`` directory (and ``checkpoint.load``
to resume from), DCP files (or ``torch.save``'s with ``ckpt_format=torch``) with a
manifest of checksums and a commit marker.

A save writes into a temporary directory; every rank checksums and fsyncs its own files,
rank 0 gathers the lists, writes ``manifest.json``, renames the directory and writes
``COMMITTED``; the decision is broadcast, so every rank agrees. Retention keeps
``most_recent_k`` checkpoints (never one being loaded). A load verifies the manifest's
checksums (each rank a share of the files) before DCP reads anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from rankguard.checkpoint.dcpio import (
    checkpoint_exception,
    copy_into,
    dcp,
    describe,
    save_errors,
    single_process_quiet,
)
from rankguard.checkpoint.files import (
    MANIFEST_FILE,
    TMP_PREFIX,
    CheckpointError,
    DirLock,
    FileEntry,
    Manifest,
    committed_steps,
    probe_writable,
    prune,
    read_manifest,
    replace_dir,
    root_problem,
    step_dir_name,
    verify_files,
    write_commit,
    write_manifest,
)
from rankguard.checkpoint.tiers import Candidate, SaveJob, TierHost
from rankguard.checkpoint.writer import Digest
from rankguard.schema.jsontypes import JsonObject
from rankguard.util.fs import fsync_dir

__all__ = ["PER_RANK_FILE", "TORCH_FILE", "PersistentTier"]

PER_RANK_FILE = "rank_{rank}.state"
TORCH_FILE = "state.pt"


class PersistentTier:
    """A :class:`~rankguard.checkpoint.tiers.CheckpointTier` on the shared directory."""

    name = "persistent"

    def __init__(self, host: TierHost, save_dir: Path | None, load_dir: Path | None) -> None:
        self.host = host
        self.save_dir, self.load_dir = save_dir, load_dir
        #: checkpoints being loaded: retention never removes them
        self.protect: set[Path] = set()
        self._said: set[str] = set()  # warnings given once

    # ---- set-up ---------------------------------------------------------------------

    def prepare(self, locks: list[DirLock]) -> str | None:
        """Rank 0: the save directory writable and locked for this job (its torn saves
        removed); the problem, if any."""
        host = self.host
        if self.save_dir is None or host.rank != 0:
            return None
        problem = probe_writable(self.save_dir)
        if problem is None:
            lock = DirLock(self.save_dir, host.job)
            lock.acquire()
            locks.append(lock)
            took_over = lock.took_over_line()
            if took_over is not None:
                self.host.say(took_over, logging.WARNING)
            prune(self.save_dir, -1, protect=set(), keep_tmp_prefix=None)
        return problem

    def latest(self) -> int | None:
        """Collective: the newest step already committed (what a restart finds)."""
        if self.save_dir is None:
            return None
        found = committed_steps(self.save_dir) if self.host.rank == 0 else []
        return self.host.group.broadcast(found[0][0] if found else None)

    # ---- save -----------------------------------------------------------------------

    def start_save(self, step: int, blocking: bool, t0: float) -> SaveJob:
        host, config = self.host, self.host.config
        assert self.save_dir is not None
        nonce = f"{TMP_PREFIX}{step_dir_name(step)}.a{host.attempt}s{host.seq}"
        tmp = self.save_dir / nonce
        per_rank = host.plan.per_rank_bytes()
        upload: Future[Any] | None = None
        writer: Any = None
        stage_s = 0.0
        if config.ckpt_format == "torch" or blocking:
            state = host.plan.global_state_dict()
        else:
            writer = host.writer(tmp, background=True)
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kind = AsyncCheckpointerType(config.async_checkpointer_type)
            with single_process_quiet(host.group):
                response = dcp().async_save(
                    host.plan.global_state_dict(),
                    storage_writer=writer,
                    process_group=host.group.pg,
                    async_checkpointer_type=kind,
                    async_stager=host.stager,
                    no_dist=not host.group.distributed,
                )
            upload = response if isinstance(response, Future) else response.upload_completion
            stage_s = time.monotonic() - t0
            host.say(
                f"Scheduling async checkpoint save at step {step} (persistent): staged "
                f"{host.stager.bytes / 1e9:.2f} GB in {stage_s:.3f} s",
                logging.INFO,
            )

        def job() -> None:
            error: str | None = None
            w0 = time.monotonic()
            try:
                if upload is not None:
                    upload.result()
                    self._say_priority(writer)
                elif config.ckpt_format == "torch":
                    self._write_torch_format(tmp, state)
                else:
                    with single_process_quiet(host.group):
                        dcp().save(
                            state,
                            storage_writer=host.writer(tmp),
                            process_group=host.group.pg,
                            no_dist=not host.group.distributed,
                        )
                entries = self._entries(tmp, per_rank, _digests_of(writer))
            except save_errors() as exc:  # gathered: every rank decides the same
                error = f"rank {host.rank}: {describe(exc)}"
                entries = []
            self._commit(step, tmp, error, entries, t0, stage_s, w0)

        return job

    def _say_priority(self, writer: Any) -> None:
        """Tell when the write did not run in ``SCHED_IDLE`` as configured (that it
        cannot: once)."""
        module = sys.modules.get("rankguard.checkpoint.background")
        if module is None or not isinstance(writer, module.BackgroundWriter):
            return
        note = writer.idle_note()
        if note is None or note[1] in self._said:
            return
        level, line = note
        if level >= logging.WARNING:
            self._said.add(line)
        self.host.say(line, level)

    def _write_torch_format(self, tmp: Path, state: dict[str, Any]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        if self.host.rank == 0:
            with open(tmp / TORCH_FILE, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())

    def _entries(self, tmp: Path, per_rank: bytes, digests: dict[str, Digest]) -> list[FileEntry]:
        """This rank's files of the checkpoint, fsynced, with their checksums: those the
        writer took as it wrote (``digests``), the others read back."""
        rank = self.host.rank
        tmp.mkdir(parents=True, exist_ok=True)
        name = PER_RANK_FILE.format(rank=rank)
        with open(tmp / name, "wb") as fh:
            fh.write(per_rank)
            fh.flush()
            os.fsync(fh.fileno())
        algo = self.host.config.checksum
        digests = {**digests, name: Digest.of(per_rank, algo)}
        mine = [name]
        prefix = f"__{rank}_"
        for entry in os.listdir(tmp):
            if entry.startswith(prefix) and entry.endswith(".distcp"):
                mine.append(entry)
        if rank == 0:
            mine += [n for n in (".metadata", TORCH_FILE) if (tmp / n).exists()]
        return [FileEntry.of(tmp, n, rank, algo, digest=digests.get(n)) for n in sorted(mine)]

    def _commit(
        self,
        step: int,
        tmp: Path,
        error: str | None,
        entries: list[FileEntry],
        t0: float,
        stage_s: float,
        w0: float,
    ) -> None:
        host, config = self.host, self.host.config
        assert self.save_dir is not None
        gathered = host.group.all_gather((error, entries))
        final = self.save_dir / step_dir_name(step)
        decision: str | None = None
        if host.rank == 0:
            errors = [e for e, _ in gathered if e]
            if errors:
                decision = "; ".join(errors)
            else:
                try:
                    meta: JsonObject = {
                        "tier": "persistent",
                        "world_size": host.world,
                        "format": config.ckpt_format,
                        "job": host.job,
                        "time": time.time(),
                    }
                    all_entries = [e for _, es in gathered for e in es]
                    digest = write_manifest(tmp, step, all_entries, meta, config.checksum)
                    fsync_dir(tmp)
                    replace_dir(tmp, final)
                    write_commit(final, step, digest, meta)
                except Exception as exc:
                    decision = f"rank 0: commit: {describe(exc)}"
            if decision is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        decision = host.group.broadcast(decision)
        if decision is not None:
            host.note_failed("persistent", step, decision)
        host.note_committed("persistent", step, final, t0, stage_s, w0)
        if host.rank == 0:
            protect = self.protect | {final}
            keep = config.most_recent_k
            prune(
                self.save_dir, -1 if keep is None else keep, protect=protect, keep_tmp_prefix=None
            )

    # ---- load -----------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Collective: the committed steps of ``checkpoint.load``, newest first."""
        host = self.host
        if self.load_dir is None:
            return []
        problem = root_problem(self.load_dir, owner=False) if host.rank == 0 else None
        errors = host.group.errors(problem)
        if errors:
            raise CheckpointError("checkpoint load directory not usable: " + errors[0])
        # a step may link to another run's (read only here; retention never follows it)
        listed = committed_steps(self.load_dir, links=True) if host.rank == 0 else []
        return [
            Candidate(step, self.name, Path(path))
            for step, path in host.group.broadcast([(s, str(p)) for s, p in listed])
        ]

    def load(self, candidate: Candidate) -> bool:
        step, path = candidate.step, Path(candidate.where)
        self.protect.add(path)
        try:
            return self._load(step, path)
        finally:
            self.protect.discard(path)

    def _load(self, step: int, path: Path) -> bool:
        host = self.host
        error = None
        manifest: Manifest | None = None
        per_rank: dict[str, Any] | None = None
        try:
            manifest = read_manifest(path)
            names = sorted(manifest.files)
            verify_files(path, manifest, names[host.rank :: host.world])
            per_rank = self._per_rank_of(path, manifest)
        except CheckpointError as exc:
            error = str(exc)
        errors = host.group.errors(error)
        if errors:
            host.say(
                f"checkpoint step {step} at {path} is torn or corrupt, falling back to "
                f"an older one: {'; '.join(errors)}",
                logging.WARNING,
            )
            return False
        current = host.plan.global_state_dict()
        try:
            if manifest is not None and manifest.doc.get("format") == "torch":
                loaded = torch.load(path / TORCH_FILE, map_location="cpu", weights_only=True)
                copy_into(current, loaded, "")
            else:
                with single_process_quiet(host.group):
                    dcp().load(
                        current,
                        checkpoint_id=path,
                        process_group=host.group.pg,
                        no_dist=not host.group.distributed,
                    )
        except (CheckpointError, checkpoint_exception(), ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"checkpoint step {step} at {path} does not fit the state: {describe(exc)}"
            ) from exc
        host.plan.load_global(current)
        if per_rank is not None:
            host.plan.load_per_rank(per_rank)
        host.note_loaded("persistent", step, path)
        return True

    def _per_rank_of(self, path: Path, manifest: Manifest) -> dict[str, Any] | None:
        """This rank's saved own state in checkpoint ``path`` (plain data only), if any."""
        host = self.host
        saved_world = manifest.doc.get("world_size") or host.world
        if type(saved_world) is not int or saved_world < 1:
            raise CheckpointError(f"{path / MANIFEST_FILE}: world_size {saved_world!r:.40}")
        per_rank = path / PER_RANK_FILE.format(rank=host.rank % saved_world)
        if not per_rank.exists():
            return None
        try:
            return host.plan.parse_per_rank(per_rank.read_bytes())
        except OSError as exc:
            raise CheckpointError(f"{per_rank}: unreadable ({exc.strerror})") from None
        except CheckpointError as exc:
            raise CheckpointError(f"{per_rank}: {exc}") from None


def _digests_of(writer: Any) -> dict[str, Digest]:
    """The checksums the writer took in this process (none from DCP's checkpoint
    process, nor from a writer of the caller's: those files are read back)."""
    module = sys.modules.get("rankguard.checkpoint.background")
    if module is None or not isinstance(writer, module.BackgroundWriter):
        return {}
    return dict(writer.checksums())
