"""``CheckpointManager``: save (sync or async) and ``load_latest`` over the checkpoint
tiers, on torch.distributed.checkpoint (DCP).

The tiers (:class:`~rankguard.checkpoint.persistent.PersistentTier`,
:class:`~rankguard.checkpoint.localtier.LocalTier`) write, commit, list and load their
own checkpoints behind :class:`~rankguard.checkpoint.tiers.CheckpointTier`; the manager
keeps their order and the fallback from one candidate to the next, the background
executor of async saves and the session's ``checkpointing`` phase; its
:class:`~rankguard.checkpoint.record.CheckpointRecord` keeps the account of the saves
and loads that ``checkpoints.json`` holds.

Every rank builds the manager at the same point (it creates its own gloo group) and
calls ``save``/``maybe_save``/``load_latest`` at the same steps. A save waits for the
previous one (raising if it failed), marks the ``checkpointing`` phase of the session
(checkpoint_timeout_s) and starts in its tier: sync, it writes and commits in the
caller; async, the state is copied into host buffers (the only stall:
:class:`HostStager`), so the checkpoint is the state at the call, and the write and
commit go on in the manager's background thread (or DCP's process). The commit decision
is every rank's, so every rank's ``last_committed`` agrees.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist

from rankguard.checkpoint.config import CheckpointConfig
from rankguard.checkpoint.dcpio import default_writer
from rankguard.checkpoint.files import CheckpointError, DirLock, step_dir_name
from rankguard.checkpoint.group import CheckpointGroup
from rankguard.checkpoint.local import LocalStore
from rankguard.checkpoint.localtier import LocalTier
from rankguard.checkpoint.persistent import PersistentTier
from rankguard.checkpoint.record import CheckpointRecord
from rankguard.checkpoint.stager import HostStager
from rankguard.checkpoint.state import StatePlan
from rankguard.checkpoint.tiers import Candidate, CheckpointTier
from rankguard.rank import runenv
from rankguard.rank.ranksession import current as current_session
from rankguard.rank.runenv import RunEnv
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import CHECKPOINTS_FILE

if TYPE_CHECKING:
    from rankguard.rank.ranksession import RankSession

__all__ = ["TIERS", "CheckpointManager"]

logger = logging.getLogger(__name__)

TIERS = ("persistent", "local")

WriterFactory = Callable[[Path], Any]


class CheckpointManager:
    """Save and restore ``state`` (name -> model, optimizer, scheduler, per-rank state).

    It is also the tiers' :class:`~rankguard.checkpoint.tiers.TierHost`: what they share
    (the state, the group, the staging buffers) and the bookkeeping of each save."""

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
        self._writer_factory = writer_factory  # None: the default writers (``writer``)
        self._session = session
        self.save_dir = Path(config.save).resolve() if config.save else None
        self.load_dir = Path(config.load_dir).resolve() if config.load_dir else None
        self.local_world_size = local_world_size or env.local_world_size or 1
        # checkpoints.json: where asked, else in the run directory under rankguard run
        run_dir = Path(env.run_dir) if env.monitored and env.run_dir else None
        self.record = CheckpointRecord(
            TIERS,
            rank=self.rank,
            world=self.world,
            job=self.job,
            async_save=config.async_save,
            status_path=(
                Path(status_path)
                if status_path is not None
                else run_dir and run_dir / CHECKPOINTS_FILE
            ),
        )
        self.seq = 0
        #: what the last ``load_latest`` loaded: its tier and step and, for the local
        #: tier, which rank held each rank's shard (``where``); None: nothing loaded
        self.loaded_from: Candidate | None = None
        self._save_steps: int | None = None  # the session's training steps at save()
        self._inflight: Future[None] | None = None
        self._background: Any = None  # the last async save's BackgroundWriter
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankguard-ckpt")
        self.stager = HostStager(pin_memory=config.pin_memory)
        self._locks: list[DirLock] = []
        self._closed = False
        self._local = LocalTier(self, self.local_world_size)
        self._persistent = PersistentTier(self, self.save_dir, self.load_dir)
        # the tiers, in the order every rank gathers their candidates
        self.tiers: dict[str, CheckpointTier] = {
            "local": self._local,
            "persistent": self._persistent,
        }
        for message in config.warnings() + self._local.warnings():
            self.say(message, logging.WARNING)
        self._prepare_dirs()
        # what a restart finds already committed
        self.last_committed["persistent"] = self._persistent.latest()
        self.record.write()
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)

    @property
    def last_committed(self) -> dict[str, int | None]:
        """Each tier's last committed step (None: none yet)."""
        return self.record.last_committed

    @property
    def local(self) -> LocalStore | None:
        """The local tier's store (None: the local tier is off)."""
        return self._local.store

    # ---- set-up ---------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        """Writable directories and their locks, checked before training starts; any
        rank's problem is every rank's error."""
        try:
            problem = self._persistent.prepare(self._locks) or self._local.prepare(self._locks)
        except (CheckpointError, OSError) as exc:
            problem = str(exc)
        errors = self.group.errors(f"rank {self.rank}: {problem}" if problem else None)
        if errors:
            self._release_locks()
            raise CheckpointError("checkpoint directories not usable: " + "; ".join(errors))

    def writer(self, path: Path, background: bool = False) -> Any:
        """DCP's storage writer for ``path`` (``writer_factory``'s when one was given);
        ``background``: an async save's, checksumming as it writes."""
        if self._writer_factory is not None:
            return self._writer_factory(path)
        if background:
            from rankguard.checkpoint.background import BackgroundWriter

            config = self.config
            writer = BackgroundWriter(
                path,
                config.checksum,
                priority=config.async_write_priority,
                idle_max_s=config.async_idle_max_s,
            )
            self._background = writer  # the write a wait ends the idle window of
            return writer
        return default_writer(path)

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
        self.seq += 1
        session = self._live_session()  # the steps this save's state is as of
        self._save_steps = session.training_steps() if session is not None else None
        t0 = time.monotonic()
        with self._phase(f"{tier}:{step_dir_name(step)}"):
            job = self.tiers[tier].start_save(step, blocking, t0)
            if blocking:
                job()
                return
        self.record.save_started(tier, step)
        self._inflight = self._executor.submit(job)

    def note_committed(
        self, tier: str, step: int, path: Path, t0: float, stage_s: float, w0: float
    ) -> None:
        now = time.monotonic()
        self.record.save_committed(
            tier, step, path, stage_s=stage_s, write_s=now - w0, total_s=now - t0
        )
        session = self._live_session()
        if tier == "persistent" and session is not None:  # what a requeued job can load
            session.note_saved(step, self._save_steps)
        self.say(
            f"checkpoint step {step} ({tier}) committed: {path} (stage {stage_s:.3f} s, "
            f"write {now - w0:.3f} s, total {now - t0:.3f} s)",
            logging.INFO,
        )

    def note_failed(self, tier: str, step: int, why: str) -> None:
        latest = self.last_committed[tier]
        message = (
            f"checkpoint step {step} ({tier}) FAILED, nothing committed (the latest {tier} "
            f"checkpoint is still {'step ' + str(latest) if latest is not None else 'none'}): "
            f"{why}"
        )
        self.record.save_failed(message)
        self.say(message, logging.ERROR)
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
        if self._background is not None:  # the loop waits: nothing to yield the cores to
            self._background.end_idle()
        step = self.record.inflight.step if self.record.inflight is not None else None
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
        self.loaded_from = None
        for candidate in self._candidates():
            if self.tiers[candidate.tier].load(candidate):
                self.loaded_from = candidate
                self._note_resumed(candidate.step)
                return candidate.step
        return None

    def _note_resumed(self, step: int) -> None:
        """The session shows ``step`` plus the steps since as the iteration of a script
        that does not number its steps itself."""
        session = self._live_session()
        if session is not None:
            session.note_resumed(step)

    def _live_session(self) -> RankSession | None:
        """The session saves and loads report to (None: none, or a disabled one)."""
        session = self._session
        if session is False:
            return None
        if session is None:
            session = current_session()
        return session if session is not None and session.enabled else None

    def _candidates(self) -> list[Candidate]:
        """Every tier's candidates, newest first (the local tier first at one step)."""
        out = [c for tier in self.tiers.values() for c in tier.candidates()]
        out.sort(key=lambda c: (c.step, c.tier == "local"), reverse=True)
        return out

    def note_loaded(self, tier: str, step: int, path: Path) -> None:
        self.record.checkpoint_loaded(tier, step, path)
        self.say(f"resumed from checkpoint step {step} ({tier}): {path}", logging.INFO)

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
            self.stager.close()
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

    def status(self) -> JsonObject:
        """What ``checkpoints.json`` holds: last committed per tier, durations, the write
        in flight, failures."""
        return self.record.to_json()

    def _phase(
        self, name: str, *, progress: bool = True
    ) -> contextlib.AbstractContextManager[None]:
        session = self._live_session()
        if session is None:
            return contextlib.nullcontext()
        return session.checkpoint(name, progress=progress)

    def say(self, message: str, level: int, *, everywhere: bool = False) -> None:
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
