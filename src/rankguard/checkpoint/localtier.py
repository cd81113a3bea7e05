"""The local tier: each node's ``non_persistent_local_ckpt_dir``, one file per rank and
step (:class:`~rankguard.checkpoint.local.LocalStore`), with replicas on the ranks
``replication_jump`` apart (other nodes) when ``replication`` is on.

A save writes this rank's file (and the replicas it holds for others: one exchange in
the checkpoint group); ``atomic`` makes the ranks of a node write one after another. A
load gathers every rank's holdings: a step loads when some rank holds each rank's
shard, sent to its owner when the owner lost its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rankguard.checkpoint.dcpio import copy_into, describe, localize, save_errors
from rankguard.checkpoint.files import CheckpointError, DirLock, probe_writable
from rankguard.checkpoint.local import LocalStore, deserialize, replica_peers, serialize
from rankguard.checkpoint.tiers import Candidate, SaveJob, TierHost
from rankguard.schema.jsontypes import JsonObject

__all__ = ["LocalTier"]


class LocalTier:
    """A :class:`~rankguard.checkpoint.tiers.CheckpointTier` on the node's own disk
    (``store`` None: the tier is off, it has no candidates)."""

    name = "local"

    def __init__(self, host: TierHost, local_world_size: int) -> None:
        self.host = host
        self.local_world_size = local_world_size
        self.store: LocalStore | None = None
        #: the ranks this one sends its replica to, and those it holds replicas of
        self.peers: tuple[list[int], list[int]] = ([], [])
        config = host.config
        if config.local_enabled:
            assert config.non_persistent_local_ckpt_dir
            root = Path(config.non_persistent_local_ckpt_dir).resolve()
            self.store = LocalStore(root, host.rank, config.checksum)
            if config.replication:
                jump = config.replication_jump or local_world_size
                self.peers = replica_peers(host.rank, host.world, config.replication_factor, jump)

    # ---- set-up ---------------------------------------------------------------------

    def warnings(self) -> list[str]:
        """Replication that cannot take effect as configured."""
        cfg, world = self.host.config, self.host.world
        if not (cfg.local_enabled and cfg.replication) or world == 1:
            return []
        jump = cfg.replication_jump or self.local_world_size
        if not self.peers[0]:
            return [
                f"checkpoint.replication=true has NO effect: with {world} rank(s) and "
                f"replication_jump={jump} every replica would land on the rank itself "
                "(one node?); local checkpoints are not replicated"
            ]
        if jump % self.local_world_size:
            return [
                f"checkpoint.replication_jump={jump} is not a multiple of the local world "
                f"size ({self.local_world_size}): some replicas stay on their own node"
            ]
        return []

    def prepare(self, locks: list[DirLock]) -> str | None:
        """The local directory writable; the first rank of a node locks it for this job."""
        if self.store is None:
            return None
        problem = probe_writable(self.store.root)
        if problem is None and self.host.rank % self.local_world_size == 0:
            lock = DirLock(self.store.root, self.host.job)
            lock.acquire()
            locks.append(lock)
            took_over = lock.took_over_line()
            if took_over is not None:
                self.host.say(took_over, logging.WARNING)
        return problem

    # ---- save -----------------------------------------------------------------------

    def start_save(self, step: int, blocking: bool, t0: float) -> SaveJob:
        host = self.host
        assert self.store is not None
        store = self.store
        live = host.plan.global_state_dict()
        per_rank = host.plan.per_rank_bytes()
        stage_s = 0.0
        staged: Any = live
        if not blocking:
            staged = host.stager.stage(live)
            stage_s = time.monotonic() - t0
            host.say(
                f"Scheduling async checkpoint save at step {step} (local): staged "
                f"{host.stager.bytes / 1e9:.2f} GB in {stage_s:.3f} s",
                logging.INFO,
            )

        def job() -> None:
            w0 = time.monotonic()
            error = None
            try:
                self._write(step, staged, per_rank)
            except save_errors() as exc:
                error = f"rank {host.rank}: {describe(exc)}"
            errors = host.group.errors(error)
            if errors:
                host.note_failed("local", step, "; ".join(errors))
            host.note_committed("local", step, store.root, t0, stage_s, w0)
            keep = host.config.non_persistent_most_recent_k
            store.prune(-1 if keep is None else keep, protect={step})

        return job

    def _write(self, step: int, state: dict[str, Any], per_rank: bytes) -> None:
        host = self.host
        assert self.store is not None
        data = serialize(
            {"global": localize(state), "per_rank": per_rank, "step": step, "world": host.world}
        )
        meta: JsonObject = {
            "tier": "local",
            "world_size": host.world,
            "job": host.job,
            "time": time.time(),
        }
        with self._node_turn():
            self.store.write(step, host.rank, data, meta)
        to, frm = self.peers
        if to:
            received = host.group.exchange(to, frm, data)
            with self._node_turn():
                for owner, blob in zip(frm, received, strict=True):
                    self.store.write(step, owner, blob, meta)

    @contextlib.contextmanager
    def _node_turn(self) -> Iterator[None]:
        """``atomic``: the ranks sharing a local directory write one after another."""
        if self.host.config.non_persistent_local_ckpt_algo != "atomic":
            yield
            return
        assert self.store is not None
        with open(self.store.root / ".write_turn", "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    # ---- load -----------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Collective: the steps some rank holds every rank's shard of, newest first;
        ``where``: which rank holds each owner's shard."""
        host = self.host
        out: list[Candidate] = []
        if self.store is None:
            return out
        holdings = host.group.all_gather(self.store.holdings(host.world))
        steps = sorted({s for h in holdings for s in h}, reverse=True)
        for step in steps:
            holders: dict[int, int] = {}
            for holder, held in enumerate(holdings):
                for owner in held.get(step, []):
                    if owner == holder or owner not in holders:
                        holders[owner] = holder
            if len(holders) == host.world:
                out.append(Candidate(step, self.name, holders))
            elif host.rank == 0:
                missing = sorted(set(range(host.world)) - set(holders))
                host.say(
                    f"local checkpoint step {step} is incomplete: no verified copy of "
                    f"rank(s) {missing}'s shard",
                    logging.WARNING,
                )
        return out

    def load(self, candidate: Candidate) -> bool:
        host, step, holders = self.host, candidate.step, candidate.where
        assert self.store is not None
        mine: bytes | None = None
        error = None
        try:
            for owner in range(host.world):
                holder = holders[owner]
                if holder == owner:
                    if owner == host.rank:
                        mine = self.store.read(step, owner)
                elif host.rank == holder:
                    host.group.send(owner, self.store.read(step, owner))
                elif host.rank == owner:
                    mine = host.group.recv(holder)
                    host.say(
                        f"local checkpoint step {step}: rank {owner}'s shard restored from "
                        f"the replica on rank {holder}",
                        logging.WARNING,
                        everywhere=True,
                    )
            assert mine is not None
            payload = deserialize(mine)
            per_rank = host.plan.parse_per_rank(payload["per_rank"])
        except (CheckpointError, OSError, RuntimeError, KeyError) as exc:
            error = f"rank {host.rank}: {describe(exc)}"
        errors = host.group.errors(error)
        if errors:
            host.say(
                f"local checkpoint step {step} unusable, falling back: {'; '.join(errors)}",
                logging.WARNING,
            )
            return False
        current = host.plan.global_state_dict()
        copy_into(current, payload["global"], "")
        host.plan.load_global(current)
        host.plan.load_per_rank(per_rank)
        host.note_loaded("local", step, self.store.root)
        return True
