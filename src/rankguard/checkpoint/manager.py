"""``CheckpointManager``: save (sync or async), retention and ``load_latest`` over both
tiers, on torch.distributed.checkpoint (DCP).

Every rank builds the manager at the same point (it creates its own gloo group) and
calls ``save``/``maybe_save``/``load_latest`` at the same steps. A save:

1. waits for the previous save and raises if that one failed;
2. marks the ``checkpointing`` phase of the rankguard session (checkpoint_timeout_s);
3. sync: writes and commits in the caller; async: copies the whole state into host
   buffers (the only stall: :class:`HostStager` through DCP's ``async_save``), so the
   checkpoint is the state at the call whatever the loop does next, and returns while
   DCP's thread (or process) writes that copy;
4. commits: every rank checksums and fsyncs its own files, rank 0 gathers the lists,
   writes ``manifest.json``, renames the temporary directory and writes ``COMMITTED``;
   the decision is broadcast, so every rank's ``last_committed`` agrees;
5. retention keeps ``most_recent_k`` (``non_persistent_most_recent_k``) checkpoints.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

from rankguard import runenv
from rankguard._fs import atomic_write_json, fsync_dir
from rankguard.checkpoint.config import CheckpointConfig
from rankguard.checkpoint.files import (
    MANIFEST_FILE,
    TMP_PREFIX,
    CheckpointError,
    DirLock,
    FileEntry,
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
from rankguard.checkpoint.group import CheckpointGroup
from rankguard.checkpoint.local import LocalStore, deserialize, replica_peers, serialize
from rankguard.checkpoint.stager import HostStager, dtensor_type
from rankguard.checkpoint.state import StatePlan
from rankguard.checkpoint.tiers import BoundTier, Candidate, CheckpointTier
from rankguard.checkpoint.writer import Digest
from rankguard.cpuprio import yield_cpu
from rankguard.ranksession import current as current_session
from rankguard.runenv import RunEnv
from rankguard.schema.layout import CHECKPOINTS_FILE

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemWriter

    from rankguard.ranksession import RankSession

__all__ = ["TIERS", "CheckpointManager"]

logger = logging.getLogger(__name__)

TIERS = ("persistent", "local")
PER_RANK_FILE = "rank_{rank}.state"
TORCH_FILE = "state.pt"

WriterFactory = Callable[[Path], Any]


def _dcp() -> Any:
    """``torch.distributed.checkpoint``, imported at the first save or load that needs it:
    a rank that never checkpoints does not pay for its import (DTensor, sympy: about as
    long as importing torch itself)."""
    import torch.distributed.checkpoint as dcp

    return dcp


def _checkpoint_exception() -> type[BaseException]:
    """DCP's ``CheckpointException`` (a ``BaseException``: caught by name)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _errors() -> tuple[type[BaseException], ...]:
    return (Exception, _checkpoint_exception())


def _default_writer(path: Path) -> FileSystemWriter:
    return _dcp().FileSystemWriter(path, sync_files=True)


class CheckpointManager:
    """Save and restore ``state`` (name -> model, optimizer, scheduler, per-rank state)."""

    def __init__(
        self,
        config: CheckpointConfig,
        state: Mapping[str, Any],
        *,
        process_group: Any = None,
        job_id: str | None = None,
        local_world_size: int | None = None,
        writer_factory: WriterFactory | None = None,
        session: RankSession | Literal[False] | None = None,
        status_path: str | os.PathLike[str] | None = None,
        env: RunEnv | None = None,
    ) -> None:
        """``session``: where saves mark the ``checkpointing`` phase (default: the
        process's, ``rankguard.session.current()``; False: none). ``env``: the run's environment
        (default: this process's): the attempt, the local world size, the job's id and,
        under ``rankguard run``, where ``checkpoints.json`` goes."""
        env = env or runenv.current()
        if not isinstance(config, CheckpointConfig):
            raise TypeError("config: a rankguard.checkpoint.CheckpointConfig")
        if not config.save and not config.load and not config.local_enabled:
            raise ValueError(
                "checkpoint: nothing to do: set checkpoint.save (and/or checkpoint.load, "
                "checkpoint.non_persistent_ckpt_type=local)"
            )
        self.config = config
        self.plan = StatePlan(state)
        if config.async_checkpointer_type == "process" and not dist.is_initialized():
            raise CheckpointError(
                "checkpoint.async_checkpointer_type=process needs torch.distributed "
                "initialised (DCP's checkpoint process joins the job's ranks); use thread"
            )
        self.group = CheckpointGroup(process_group, timeout_s=config.dist_timeout_s)
        self.rank, self.world = self.group.rank, self.group.world
        self.job = job_id or env.job_id or f"{socket.gethostname()}:{os.getppid()}"
        self.attempt = env.restart_count
        self._writer_factory = writer_factory
        self._session = session
        self.save_dir = Path(config.save).resolve() if config.save else None
        self.load_dir = Path(config.load_dir).resolve() if config.load_dir else None
        lws = local_world_size or env.local_world_size or 1
        self.local_world_size = lws
        self.local: LocalStore | None = None
        self._peers: tuple[list[int], list[int]] = ([], [])
        self.last_committed: dict[str, int | None] = dict.fromkeys(TIERS)
        self.stats: dict[str, Any] = {
            "saves": dict.fromkeys(TIERS, 0),
            "failures": 0,
            "last_error": None,
            "last": dict.fromkeys(TIERS),
            "inflight": None,
            "loaded": None,
        }
        self._seq = 0
        self._inflight: Future[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankguard-ckpt")
        self._stager = HostStager(pin_memory=config.pin_memory)
        self._locks: list[DirLock] = []
        self._protect: set[Path] = set()
        self._closed = False
        self._status_path = self._status_file(status_path, env)
        self._status_lock = threading.Lock()
        if config.local_enabled:
            assert config.non_persistent_local_ckpt_dir
            self.local = LocalStore(
                Path(config.non_persistent_local_ckpt_dir).resolve(), self.rank, config.checksum
            )
            if config.replication:
                jump = config.replication_jump or lws
                self._peers = replica_peers(self.rank, self.world, config.replication_factor, jump)
        # the tiers, in the order every rank gathers their candidates
        self.tiers: dict[str, CheckpointTier] = {
            "local": BoundTier(
                "local", self._start_local, self._local_candidates, self._load_local
            ),
            "persistent": BoundTier(
                "persistent",
                self._start_persistent,
                self._persistent_candidates,
                self._load_persistent,
            ),
        }
        for message in config.warnings() + self._replication_warnings():
            self._say(message, logging.WARNING)
        self._prepare_dirs()
        if self.save_dir is not None:  # what a restart finds already committed
            found = committed_steps(self.save_dir) if self.rank == 0 else []
            self.last_committed["persistent"] = self.group.broadcast(found[0][0] if found else None)
        self._write_status()
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)

    # ---- set-up ---------------------------------------------------------------------

    def _replication_warnings(self) -> list[str]:
        cfg = self.config
        if not (cfg.local_enabled and cfg.replication) or self.world == 1:
            return []
        jump = cfg.replication_jump or self.local_world_size
        if not self._peers[0]:
            return [
                f"checkpoint.replication=true has NO effect: with {self.world} rank(s) and "
                f"replication_jump={jump} every replica would land on the rank itself "
                "(one node?); local checkpoints are not replicated"
            ]
        if jump % self.local_world_size:
            return [
                f"checkpoint.replication_jump={jump} is not a multiple of the local world "
                f"size ({self.local_world_size}): some replicas stay on their own node"
            ]
        return []

    def _prepare_dirs(self) -> None:
        """Writable directories and their locks, checked before training starts; any
        rank's problem is every rank's error."""
        problem: str | None = None
        try:
            if self.save_dir is not None and self.rank == 0:
                problem = probe_writable(self.save_dir)
                if problem is None:
                    lock = DirLock(self.save_dir, self.job)
                    lock.acquire()
                    self._locks.append(lock)
                    self._took_over(lock)
                    prune(self.save_dir, -1, protect=set(), keep_tmp_prefix=None)
            if problem is None and self.local is not None:
                problem = probe_writable(self.local.root)
                if problem is None and self.rank % self.local_world_size == 0:
                    lock = DirLock(self.local.root, self.job)
                    lock.acquire()
                    self._locks.append(lock)
                    self._took_over(lock)
        except (CheckpointError, OSError) as exc:
            problem = str(exc)
        errors = self.group.errors(f"rank {self.rank}: {problem}" if problem else None)
        if errors:
            self._release_locks()
            raise CheckpointError("checkpoint directories not usable: " + "; ".join(errors))

    def _took_over(self, lock: DirLock) -> None:
        if lock.took_over is not None:
            self._say(
                f"{lock.path}: took over the lock of job {lock.took_over.get('job')!r} "
                f"(pid {lock.took_over.get('pid')} on this host is gone)",
                logging.WARNING,
            )

    def _status_file(self, path: str | os.PathLike[str] | None, env: RunEnv) -> Path | None:
        if path is not None:
            return Path(path)
        if env.monitored:
            assert env.run_dir is not None
            return Path(env.run_dir) / CHECKPOINTS_FILE
        return None

    # ---- save -----------------------------------------------------------------------

    def maybe_save(self, step: int) -> bool:
        """Save if ``step`` is due: the persistent tier every ``save_interval`` steps,
        else the local tier every ``non_persistent_save_interval``. True if it saved."""
        cfg = self.config
        if cfg.save_interval and step % cfg.save_interval == 0:
            self.save(step, tier="persistent")
            return True
        if (
            self.local is not None
            and cfg.non_persistent_save_interval
            and step % cfg.non_persistent_save_interval == 0
        ):
            self.save(step, tier="local")
            return True
        return False

    def save(self, step: int, *, tier: str = "persistent", blocking: bool | None = None) -> None:
        """Checkpoint ``state`` as of ``step`` into ``tier`` (collective: every rank).

        ``blocking=None`` follows ``checkpoint.async_save`` (persistent) and is always
        async for the local tier when ``async_save`` is set. Raises CheckpointError if
        the previous background write failed (this save does not start), or if a
        blocking save fails."""
        if self._closed:
            raise CheckpointError("save(): the manager is closed")
        if tier not in TIERS:
            raise ValueError(f"tier: one of {list(TIERS)}, got {tier!r}")
        if tier == "persistent" and self.save_dir is None:
            raise CheckpointError("save(tier='persistent'): checkpoint.save is not set")
        if tier == "local" and self.local is None:
            raise CheckpointError(
                "save(tier='local'): checkpoint.non_persistent_ckpt_type is not 'local'"
            )
        self.wait()
        if blocking is None:
            blocking = not self.config.async_save
        if self.config.ckpt_format != "torch_dist" and tier == "persistent":
            blocking = True
        self._seq += 1
        t0 = time.monotonic()
        with self._phase(f"{tier}:{step_dir_name(step)}"):
            job = self.tiers[tier].start_save(step, blocking, t0)
            if blocking:
                job()
                return
        self.stats["inflight"] = {"tier": tier, "step": step, "since": _iso()}
        self._write_status()
        self._inflight = self._executor.submit(_in_background, job)

    def _start_persistent(self, step: int, blocking: bool, t0: float) -> Callable[[], None]:
        assert self.save_dir is not None
        nonce = f"{TMP_PREFIX}{step_dir_name(step)}.a{self.attempt}s{self._seq}"
        tmp = self.save_dir / nonce
        per_rank = self.plan.per_rank_bytes()
        upload: Future[Any] | None = None
        writer: Any = None
        stage_s = 0.0
        if self.config.ckpt_format == "torch" or blocking:
            state = self.plan.global_state_dict()
        else:
            writer = (self._writer_factory or self._background_writer)(tmp)
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kind = AsyncCheckpointerType(self.config.async_checkpointer_type)
            with _single_process_quiet(self.group):
                response = _dcp().async_save(
                    self.plan.global_state_dict(),
                    storage_writer=writer,
                    process_group=self.group.pg,
                    async_checkpointer_type=kind,
                    async_stager=self._stager,
                    no_dist=not self.group.distributed,
                )
            upload = response if isinstance(response, Future) else response.upload_completion
            stage_s = time.monotonic() - t0
            self._say(
                f"Scheduling async checkpoint save at step {step} (persistent): staged "
                f"{self._stager.bytes / 1e9:.2f} GB in {stage_s:.3f} s",
                logging.INFO,
            )

        def job() -> None:
            error: str | None = None
            w0 = time.monotonic()
            try:
                if upload is not None:
                    upload.result()
                elif self.config.ckpt_format == "torch":
                    self._write_torch_format(tmp, state)
                else:
                    with _single_process_quiet(self.group):
                        _dcp().save(
                            state,
                            storage_writer=(self._writer_factory or _default_writer)(tmp),
                            process_group=self.group.pg,
                            no_dist=not self.group.distributed,
                        )
                entries = self._persistent_entries(tmp, per_rank, _digests_of(writer))
            except _errors() as exc:  # gathered: every rank decides the same
                error = f"rank {self.rank}: {_describe(exc)}"
                entries = []
            self._commit_persistent(step, tmp, error, entries, t0, stage_s, w0)

        return job

    def _write_torch_format(self, tmp: Path, state: dict[str, Any]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            with open(tmp / TORCH_FILE, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())

    def _background_writer(self, path: Path) -> Any:
        from rankguard.checkpoint.background import BackgroundWriter

        return BackgroundWriter(path, self.config.checksum)

    def _persistent_entries(
        self, tmp: Path, per_rank: bytes, digests: dict[str, Digest]
    ) -> list[FileEntry]:
        """This rank's files of the checkpoint, fsynced, with their checksums: those the
        writer took as it wrote (``digests``), the others read back."""
        tmp.mkdir(parents=True, exist_ok=True)
        name = PER_RANK_FILE.format(rank=self.rank)
        with open(tmp / name, "wb") as fh:
            fh.write(per_rank)
            fh.flush()
            os.fsync(fh.fileno())
        digests = {**digests, name: Digest.of(per_rank, self.config.checksum)}
        mine = [name]
        prefix = f"__{self.rank}_"
        for entry in os.listdir(tmp):
            if entry.startswith(prefix) and entry.endswith(".distcp"):
                mine.append(entry)
        if self.rank == 0:
            mine += [n for n in (".metadata", TORCH_FILE) if (tmp / n).exists()]
        algo = self.config.checksum
        return [FileEntry.of(tmp, n, self.rank, algo, digest=digests.get(n)) for n in sorted(mine)]

    def _commit_persistent(
        self,
        step: int,
        tmp: Path,
        error: str | None,
        entries: list[FileEntry],
        t0: float,
        stage_s: float,
        w0: float,
    ) -> None:
        assert self.save_dir is not None
        gathered = self.group.all_gather((error, entries))
        final = self.save_dir / step_dir_name(step)
        decision: str | None = None
        if self.rank == 0:
            errors = [e for e, _ in gathered if e]
            if errors:
                decision = "; ".join(errors)
            else:
                try:
                    meta = {
                        "tier": "persistent",
                        "world_size": self.world,
                        "format": self.config.ckpt_format,
                        "job": self.job,
                        "time": time.time(),
                    }
                    all_entries = [e for _, es in gathered for e in es]
                    digest = write_manifest(tmp, step, all_entries, meta, self.config.checksum)
                    fsync_dir(tmp)
                    replace_dir(tmp, final)
                    write_commit(final, step, digest, meta)
                except Exception as exc:
                    decision = f"rank 0: commit: {_describe(exc)}"
            if decision is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        decision = self.group.broadcast(decision)
        if decision is not None:
            self._failed("persistent", step, decision)
        self._committed("persistent", step, final, t0, stage_s, w0)
        if self.rank == 0:
            protect = self._protect | {final}
            keep = self.config.most_recent_k
            prune(
                self.save_dir, -1 if keep is None else keep, protect=protect, keep_tmp_prefix=None
            )

    def _start_local(self, step: int, blocking: bool, t0: float) -> Callable[[], None]:
        assert self.local is not None
        live = self.plan.global_state_dict()
        per_rank = self.plan.per_rank_bytes()
        stage_s = 0.0
        staged: Any = live
        if not blocking:
            staged = self._stager.stage(live)
            stage_s = time.monotonic() - t0
            self._say(
                f"Scheduling async checkpoint save at step {step} (local): staged "
                f"{self._stager.bytes / 1e9:.2f} GB in {stage_s:.3f} s",
                logging.INFO,
            )

        def job() -> None:
            w0 = time.monotonic()
            error = None
            try:
                self._write_local(step, staged, per_rank)
            except _errors() as exc:
                error = f"rank {self.rank}: {_describe(exc)}"
            errors = self.group.errors(error)
            if errors:
                self._failed("local", step, "; ".join(errors))
            assert self.local is not None
            self._committed("local", step, self.local.root, t0, stage_s, w0)
            keep = self.config.non_persistent_most_recent_k
            self.local.prune(-1 if keep is None else keep, protect={step})

        return job

    def _write_local(self, step: int, state: dict[str, Any], per_rank: bytes) -> None:
        assert self.local is not None
        data = serialize(
            {"global": _localize(state), "per_rank": per_rank, "step": step, "world": self.world}
        )
        meta = {"tier": "local", "world_size": self.world, "job": self.job, "time": time.time()}
        with self._node_turn():
            self.local.write(step, self.rank, data, meta)
        to, frm = self._peers
        if to:
            received = self.group.exchange(to, frm, data)
            with self._node_turn():
                for owner, blob in zip(frm, received, strict=True):
                    self.local.write(step, owner, blob, meta)

    @contextlib.contextmanager
    def _node_turn(self) -> Iterator[None]:
        """``atomic``: the ranks sharing a local directory write one after another."""
        if self.config.non_persistent_local_ckpt_algo != "atomic":
            yield
            return
        assert self.local is not None
        with open(self.local.root / ".write_turn", "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _committed(
        self, tier: str, step: int, path: Path, t0: float, stage_s: float, w0: float
    ) -> None:
        now = time.monotonic()
        self.last_committed[tier] = step
        self.stats["saves"][tier] += 1
        self.stats["last"][tier] = {
            "step": step,
            "path": str(path),
            "time": _iso(),
            "stage_s": round(stage_s, 4),
            "write_s": round(now - w0, 4),
            "total_s": round(now - t0, 4),
        }
        self.stats["inflight"] = None
        self._say(
            f"checkpoint step {step} ({tier}) committed: {path} (stage {stage_s:.3f} s, "
            f"write {now - w0:.3f} s, total {now - t0:.3f} s)",
            logging.INFO,
        )
        self._write_status()

    def _failed(self, tier: str, step: int, why: str) -> None:
        self.stats["failures"] += 1
        self.stats["inflight"] = None
        latest = self.last_committed[tier]
        message = (
            f"checkpoint step {step} ({tier}) FAILED, nothing committed (the latest {tier} "
            f"checkpoint is still {'step ' + str(latest) if latest is not None else 'none'}): "
            f"{why}"
        )
        self.stats["last_error"] = message
        self._write_status()
        self._say(message, logging.ERROR)
        raise CheckpointError(message)

    def wait(self) -> None:
        """Wait for the background write in flight; raise CheckpointError if it failed.
        A write not yet done is waited for in the ``checkpointing`` phase (its timeout,
        not the step's), whose end is no progress: this wait saved nothing."""
        future, self._inflight = self._inflight, None
        if future is None:
            return
        if future.done():
            future.result()
            return
        step = (self.stats.get("inflight") or {}).get("step")
        with self._phase(
            f"wait:{step_dir_name(step) if step is not None else 'write'}", progress=False
        ):
            future.result()

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    # ---- load -----------------------------------------------------------------------

    def load_latest(self) -> int | None:
        """Load the newest complete, verified checkpoint of either tier into ``state``
        (collective); its step, or None when there is none. A torn or corrupt one is
        skipped with a warning; one that does not fit the state raises."""
        self.wait()
        # not a checkpoint phase: a save's end counts as one progress step (and so would
        # shift the agreed stop steps); a load at start-up is under the initial timeouts
        for candidate in self._candidates():
            if self.tiers[candidate.tier].load(candidate):
                self._note_resumed(candidate.step)
                return candidate.step
        return None

    def _note_resumed(self, step: int) -> None:
        """The session shows ``step`` plus the steps since as the iteration of a script
        that does not number its steps itself."""
        session = self._session
        if session is False:
            return
        if session is None:
            session = current_session()
        if session is not None and session.enabled:
            session.note_resumed(step)

    def _candidates(self) -> list[Candidate]:
        """Every tier's candidates, newest first (the local tier first at one step)."""
        out = [c for tier in self.tiers.values() for c in tier.candidates()]
        out.sort(key=lambda c: (c.step, c.tier == "local"), reverse=True)
        return out

    def _local_candidates(self) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        if self.local is not None:
            holdings = self.group.all_gather(self.local.holdings(self.world))
            steps = sorted({s for h in holdings for s in h}, reverse=True)
            for step in steps:
                holders: dict[int, int] = {}
                for holder, held in enumerate(holdings):
                    for owner in held.get(step, []):
                        if owner == holder or owner not in holders:
                            holders[owner] = holder
                if len(holders) == self.world:
                    out.append((step, holders))
                elif self.rank == 0:
                    missing = sorted(set(range(self.world)) - set(holders))
                    self._say(
                        f"local checkpoint step {step} is incomplete: no verified copy of "
                        f"rank(s) {missing}'s shard",
                        logging.WARNING,
                    )
        return out

    def _persistent_candidates(self) -> list[tuple[int, Any]]:
        if self.load_dir is None:
            return []
        problem = root_problem(self.load_dir, owner=False) if self.rank == 0 else None
        errors = self.group.errors(problem)
        if errors:
            raise CheckpointError("checkpoint load directory not usable: " + errors[0])
        # a step may link to another run's (read only here; retention never follows it)
        listed = committed_steps(self.load_dir, links=True) if self.rank == 0 else []
        return [
            (step, Path(path))
            for step, path in self.group.broadcast([(s, str(p)) for s, p in listed])
        ]

    def _load_local(self, step: int, holders: dict[int, int]) -> bool:
        assert self.local is not None
        mine: bytes | None = None
        error = None
        try:
            for owner in range(self.world):
                holder = holders[owner]
                if holder == owner:
                    if owner == self.rank:
                        mine = self.local.read(step, owner)
                elif self.rank == holder:
                    self.group.send(owner, self.local.read(step, owner))
                elif self.rank == owner:
                    mine = self.group.recv(holder)
                    self._say(
                        f"local checkpoint step {step}: rank {owner}'s shard restored from "
                        f"the replica on rank {holder}",
                        logging.WARNING,
                        everywhere=True,
                    )
            assert mine is not None
            payload = deserialize(mine)
            per_rank = self.plan.parse_per_rank(payload["per_rank"])
        except (CheckpointError, OSError, RuntimeError, KeyError) as exc:
            error = f"rank {self.rank}: {_describe(exc)}"
        errors = self.group.errors(error)
        if errors:
            self._say(
                f"local checkpoint step {step} unusable, falling back: {'; '.join(errors)}",
                logging.WARNING,
            )
            return False
        current = self.plan.global_state_dict()
        _copy_into(current, payload["global"], "")
        self.plan.load_global(current)
        self.plan.load_per_rank(per_rank)
        self._loaded("local", step, self.local.root)
        return True

    def _load_persistent(self, step: int, path: Path) -> bool:
        self._protect.add(path)
        try:
            error = None
            manifest: dict[str, Any] = {}
            per_rank: dict[str, Any] | None = None
            try:
                manifest = read_manifest(path)
                names = sorted(manifest["files"])
                verify_files(path, manifest, names[self.rank :: self.world])
                per_rank = self._per_rank_of(path, manifest)
            except CheckpointError as exc:
                error = str(exc)
            errors = self.group.errors(error)
            if errors:
                self._say(
                    f"checkpoint step {step} at {path} is torn or corrupt, falling back to "
                    f"an older one: {'; '.join(errors)}",
                    logging.WARNING,
                )
                return False
            current = self.plan.global_state_dict()
            try:
                if manifest.get("format") == "torch":
                    loaded = torch.load(path / TORCH_FILE, map_location="cpu", weights_only=True)
                    _copy_into(current, loaded, "")
                else:
                    with _single_process_quiet(self.group):
                        _dcp().load(
                            current,
                            checkpoint_id=path,
                            process_group=self.group.pg,
                            no_dist=not self.group.distributed,
                        )
            except (CheckpointError, _checkpoint_exception(), ValueError, RuntimeError) as exc:
                raise CheckpointError(
                    f"checkpoint step {step} at {path} does not fit the state: {_describe(exc)}"
                ) from exc
            self.plan.load_global(current)
            if per_rank is not None:
                self.plan.load_per_rank(per_rank)
            self._loaded("persistent", step, path)
            return True
        finally:
            self._protect.discard(path)

    def _per_rank_of(self, path: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """This rank's saved own state in checkpoint ``path`` (plain data only), if any."""
        saved_world = manifest.get("world_size") or self.world
        if type(saved_world) is not int or saved_world < 1:
            raise CheckpointError(f"{path / MANIFEST_FILE}: world_size {saved_world!r:.40}")
        per_rank = path / PER_RANK_FILE.format(rank=self.rank % saved_world)
        if not per_rank.exists():
            return None
        try:
            return self.plan.parse_per_rank(per_rank.read_bytes())
        except OSError as exc:
            raise CheckpointError(f"{per_rank}: unreadable ({exc.strerror})") from None
        except CheckpointError as exc:
            raise CheckpointError(f"{per_rank}: {exc}") from None

    def _loaded(self, tier: str, step: int, path: Path) -> None:
        if (self.last_committed[tier] or -1) < step:
            self.last_committed[tier] = step
        self.stats["loaded"] = {"tier": tier, "step": step, "path": str(path)}
        self._say(f"resumed from checkpoint step {step} ({tier}): {path}", logging.INFO)
        self._write_status()

    # ---- end ------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the write in flight (raising its error), then release everything."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            self._stager.close()
            self._release_locks()

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reporting ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``checkpoints.json`` holds: last committed per tier, durations, the write
        in flight, failures."""
        return {
            "rank": self.rank,
            "world_size": self.world,
            "job": self.job,
            "async_save": self.config.async_save,
            "last_committed": dict(self.last_committed),
            **{k: v for k, v in self.stats.items()},
            "updated": _iso(),
        }

    def _write_status(self) -> None:
        if self._status_path is None or self.rank != 0:
            return
        with self._status_lock:
            try:
                atomic_write_json(self._status_path, self.status())
            except OSError as exc:
                logger.warning("rankguard: cannot write %s: %s", self._status_path, exc)

    def _phase(
        self, name: str, *, progress: bool = True
    ) -> contextlib.AbstractContextManager[None]:
        session = self._session
        if session is False:
            return contextlib.nullcontext()
        if session is None:
            session = current_session()
        if session is not None and session.enabled:
            return session.checkpoint(name, progress=progress)
        return contextlib.nullcontext()

    def _say(self, message: str, level: int, *, everywhere: bool = False) -> None:
        """One console line (rank 0, or every rank for errors and ``everywhere``) and a
        log record (DEBUG where the line was printed: no second copy on stderr)."""
        shown = self.rank == 0 or everywhere or level >= logging.ERROR
        logger.log(
            logging.DEBUG if shown else min(level, logging.INFO), "rank %d: %s", self.rank, message
        )
        if shown:
            tag = "" if level <= logging.INFO else f"{logging.getLevelName(level)}: "
            print(f"[rankguard checkpoint] {tag}{message}", file=sys.stderr, flush=True)


def _close_at_exit(ref: weakref.ref[CheckpointManager]) -> None:
    manager = ref()
    if manager is None or manager._closed:
        return
    try:
        manager.close()
    except Exception as exc:  # at exit nobody can catch it: say it loudly
        print(f"[rankguard checkpoint] ERROR at exit: {exc}", file=sys.stderr, flush=True)


def _in_background(job: Callable[[], None]) -> None:
    """A save's background work (the manager's writer thread): at the priority that
    leaves the cores to the training (``rankguard.cpuprio.yield_cpu``)."""
    yield_cpu()
    job()


def _digests_of(writer: Any) -> dict[str, Digest]:
    """The checksums the writer took in this process (none from DCP's checkpoint
    process, nor from a writer of the caller's: those files are read back)."""
    module = sys.modules.get("rankguard.checkpoint.background")
    if module is None or not isinstance(writer, module.BackgroundWriter):
        return {}
    return dict(writer.checksums())


def _iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def _single_process_quiet(group: CheckpointGroup) -> Iterator[None]:
    """DCP warns on every single-process call that it assumes one process: it is meant."""
    if group.distributed:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def _describe(exc: BaseException) -> str:
    """One line for an error; DCP's CheckpointException carries each rank's failure."""
    if isinstance(exc, _checkpoint_exception()):
        parts = []
        failures: dict[int, Any] = getattr(exc, "failures", {})
        for rank, item in sorted(failures.items()):
            failure: Any = item[0] if isinstance(item, tuple) and item else item
            text = _describe(failure) if isinstance(failure, BaseException) else str(failure)
            parts.append(f"DCP rank {rank}: {text}")
        return "; ".join(parts)
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({cause})"
    return text if len(text) < 2000 else text[:1997] + "..."


def _localize(obj: Any) -> Any:
    """DTensors -> their local shard (a local checkpoint is per rank)."""
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(obj, dtensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: _localize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_localize(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_localize(v) for v in obj)
    return obj


def _copy_into(current: Any, loaded: Any, key: str) -> Any:
    """Load ``loaded`` into the live ``current`` structure in place (tensors copied into
    the existing ones); a shape or structure that does not fit raises, naming the key."""
    dtensor = dtensor_type()
    where = key.lstrip(".") or "<root>"
    if isinstance(current, torch.Tensor):
        target = (
            current.to_local() if dtensor is not None and isinstance(current, dtensor) else current
        )
        if not isinstance(loaded, torch.Tensor):
            raise CheckpointError(f"{where}: the checkpoint has no tensor there")
        if target.shape != loaded.shape:
            raise CheckpointError(
                f"{where}: shape {tuple(loaded.shape)} in the checkpoint, "
                f"{tuple(target.shape)} in the state"
            )
        with torch.no_grad():
            target.copy_(loaded)
        return current
    if isinstance(current, dict) and isinstance(loaded, dict):
        missing = [k for k in current if k not in loaded]
        if missing:
            raise CheckpointError(f"{where}: key(s) {missing[:5]} missing from the checkpoint")
        for k, v in loaded.items():
            current[k] = _copy_into(current.get(k), v, f"{key}.{k}")
        return current
    return loaded
