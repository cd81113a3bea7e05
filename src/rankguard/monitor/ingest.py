"""What a monitor scan reads, into the rules: local heartbeat files, records relayed
from other nodes (mirrored into local files so node 0 holds every rank's history),
each node's disk state, this node's pids that vanished, and the nodes' GPU health files.

A scan touches only files that grew (one ``stat`` each otherwise), so its cost is linear
in the number of ranks. Nothing here raises for bad data: a bad record is counted by the
rules, a file that cannot be read is read again at the next scan, a write that fails is
reported through ``write_failed`` and tried again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from rankguard.health import gpu_for_rank
from rankguard.monitor.api import RemoteSource
from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.coerce import as_int, as_str
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.layout import HEALTH_FILE_RE, HEARTBEAT_FILE_RE, HEARTBEAT_SUFFIX, RunLayout
from rankguard.schema.payloads import PayloadError, check_health, load_json
from rankguard.schema.records import HeartbeatRecord
from rankguard.util.disk import DiskState, disk_state
from rankguard.util.fs import append_bytes, atomic_write_json, dumps_line, rotate_jsonl
from rankguard.util.procs import pid_running
from rankguard.util.tailer import JsonlTailer

__all__ = ["HealthSnapshot", "Ingest"]

logger = logging.getLogger(__name__)

#: A node's GPU health: the snapshot, its file's mtime, when the monitor read it.
HealthSnapshot = tuple[JsonObject, float, float]


class Ingest:
    """The reading half of a :class:`~rankguard.monitor.monitor.JobMonitor`."""

    def __init__(
        self,
        cfg: HeartbeatConfig,
        layout: RunLayout,
        rules: HeartbeatRules,
        *,
        remote: RemoteSource | None,
        hostname: str,
        clock: Callable[[], float],
        write_failed: Callable[[Path, OSError], None],
    ) -> None:
        self.cfg = cfg
        self.layout = layout
        self.run_dir = layout.root
        self.rules = rules
        self.remote = remote
        self.hostname = hostname
        self.clock = clock
        self.write_failed = write_failed
        self.tailers: dict[str, JsonlTailer] = {}
        self.health: dict[int, HealthSnapshot] = {}
        self.disks: dict[int, DiskState] = {}
        self._health_stale: dict[int, bool] = {}
        # mirrored file per (rank, pid): bytes so far and its first line (for rotation)
        self._mirror_files: dict[tuple[int, int], tuple[int, bytes]] = {}
        # (rank, pid) of the processes another node's relay speaks for: their own node
        # judges whether they still run, never this host's process table
        self._relayed: set[tuple[int, int]] = set()

    def check_disks(self, now: float) -> None:
        """Each node's disk state into the rules: this node's run directory, and what
        the relays of the other nodes measured. Without relays every rank writes to this
        run directory (one node, or a shared filesystem): its state is every node's."""
        local = disk_state(self.run_dir)
        self.disks[0] = local
        self.rules.note_disk(0 if self.remote is not None else None, local, now)
        if self.remote is None:
            return
        try:
            relayed = self.remote.disks()
        except Exception as exc:
            logger.warning("rankguard monitor: cannot read relayed disk states: %s", exc)
            return
        for node, disk in relayed.items():
            if isinstance(node, int) and isinstance(disk, DiskState) and node != 0:
                self.disks[node] = disk
                self.rules.note_disk(node, disk, now)

    def read_local_files(self, now: float) -> None:
        with os.scandir(self.run_dir) as it:
            for entry in it:
                name = entry.name
                if not name.endswith(HEARTBEAT_SUFFIX):
                    continue
                tailer = self.tailers.get(name)
                if tailer is None:
                    if not HEARTBEAT_FILE_RE.match(name):
                        continue
                    tailer = self.tailers[name] = JsonlTailer(entry.path)
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                for record in tailer.read(st.st_size, st.st_ino):
                    self.rules.ingest(record, now)

    def ingest_remote(self, now: float) -> None:
        assert self.remote is not None
        try:
            records, health = self.remote.fetch_changed()
        except Exception as exc:
            logger.warning("rankguard monitor: cannot read relayed heartbeats: %s", exc)
            return
        # Before the records: another node's agent named a killed rank; a stopped node's
        # ranks (and the peers whose collective broke) did not fail.
        for rank, pid in self.remote.root_causes().values():
            self.rules.note_root_cause(rank, pid)
        for node, reason in sorted(self.remote.shutdowns().items()):
            self.rules.note_shutdown(f"node {node}'s launcher received {reason}")
        mirror = self.rules.world_size() <= self.cfg.mirror_relayed_max_ranks
        for raw in records:
            record = self.rules.accept(raw)
            if record is None:
                continue
            self._relayed.add((record.rank, record.pid))
            age = min(record.relayed_age_s or 0.0, 3600.0)
            if self.rules.ingest(record, now - age) and mirror:  # new: keep node 0's copy
                self.mirror(record)
        for node_rank, snapshot in health.items():
            path = self.layout.health(node_rank)
            known = self.health.get(node_rank)
            if known is None or known[0] != snapshot:
                try:
                    atomic_write_json(path, snapshot)
                except OSError as exc:  # tried again at the next scan
                    self.write_failed(path, exc)

    def mirror(self, record: HeartbeatRecord) -> None:
        """Append a relayed record to this node's copy of its heartbeat file, rotated as
        the rank's own file is (``heartbeat.max_file_mb``)."""
        key = (record.rank, record.pid)
        path = self.layout.heartbeat(*key)
        line = dumps_line(record.to_dict()).encode("utf-8")
        size, first = self._mirror_files.get(key, (-1, b""))
        if size < 0:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = 0
        if not first:
            first = line  # the oldest record this node has of the rank: its start
        limit = self.cfg.max_file_bytes
        if 0 < limit < size + len(line) and size > len(first):
            try:
                rotate_jsonl(path, first)
                size = len(first)
            except OSError as exc:
                logger.warning("rankguard monitor: cannot rotate %s: %s", path, exc)
        try:
            append_bytes(path, line, fsync=False)
        except OSError as exc:  # node 0's copy misses the line; the rules have it
            self.write_failed(path, exc)
            return
        self._mirror_files[key] = (size + len(line), first)

    def mark_vanished(self, now: float) -> None:
        """This node's ranks whose pid is gone without a process_end: an end written for
        them (killed, crashed). This node's: on this host and not relayed by another
        node. Another node's pid means nothing in this host's process table, even where
        the agents of two nodes share a host (it may be gone here, or name an unrelated
        live process): that node's relay says when its ranks end (their own
        ``process_end``, or one it synthesized), and a node whose relay stops pushing is
        lost (its ranks' heartbeats age here)."""
        relayed = self._relayed
        for state in self.rules.ranks_on(self.hostname):  # not a pass over every rank
            rec = state.record
            if rec is None or rec.ended or rec.hostname != self.hostname:
                continue
            if (rec.rank, rec.pid) in relayed or rec.relayed_age_s is not None:
                continue  # relayed now, or mirrored here by an earlier monitor
            if pid_running(rec.pid):
                continue
            self.rules.ingest(rec.vanished(time.time_ns()), now)

    def read_health(self, now: float) -> None:
        with os.scandir(self.run_dir) as it:
            for entry in it:
                match = HEALTH_FILE_RE.match(entry.name)
                if match is None:
                    continue
                node_rank = int(match.group(1))
                try:
                    mtime = entry.stat().st_mtime
                except (ValueError, FileNotFoundError):
                    continue
                known = self.health.get(node_rank)
                if known is not None and known[1] == mtime:
                    continue
                try:
                    snapshot = check_health(load_json(Path(entry.path).read_bytes()))
                except (OSError, PayloadError):
                    continue
                self.health[node_rank] = (snapshot, mtime, now)
                self._health_stale[node_rank] = False
                self.rules.mark_node(node_rank)

    def note_stale_health(self, now: float) -> None:
        """A node's health snapshot that went stale changes its ranks' verdicts."""
        stale_after = self.cfg.hardware_health.stale_after_s or 0.0
        for node, (_, _, seen) in self.health.items():
            stale = now - seen > stale_after
            if stale != self._health_stale.get(node, False):
                self._health_stale[node] = stale
                self.rules.mark_node(node)

    def health_for(self, record: HeartbeatRecord) -> JsonObject | None:
        node = record.node_rank
        known = self.health.get(node) if node is not None else None
        gpu = record.gpu
        if known is None or not gpu:
            return None
        snapshot, _, seen = known
        entry = gpu_for_rank(
            snapshot,
            str(record.hostname),
            as_str(gpu.get("uuid")) or as_str(gpu.get("token")),
            as_int(gpu.get("ordinal")),
        )
        if entry is None:
            return None
        stale_after = self.cfg.hardware_health.stale_after_s or 0.0
        return {**entry, "stale": self.clock() - seen > stale_after}
