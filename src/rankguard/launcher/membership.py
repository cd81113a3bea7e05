"""Who is in the job: hot spares and bad-node exclusion, as node services.

Both act on the rendezvous (:meth:`~rankguard.launcher.nodeservice.NodeService.wrap_rendezvous`),
before the node has a number:

- :class:`SpareService` (c10d, several nodes): torch's handler wrapped in a
  :class:`~rankguard.launcher.rendezvous.SpareKeeper` (a waiting agent is a hot spare,
  not a reason to restart the group); node 0 reads every agent's entry in the store into
  ``status.json``'s ``elastic`` block; the store's host waits for the spares still
  waiting before the store goes.
- :class:`ExclusionService` (``fault_tolerance.exclude_*``): the
  :class:`~rankguard.launcher.exclusion.NodeExclusion` wrapper around the handler (a bad
  node leaves the rendezvous), told of each failure of the node's group by the agent; an
  excluded launcher that holds the store or node 0's monitor keeps them until the job ends.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from rankguard.launcher.nodeservice import LaunchContext, NodeContext, NodeLeft, NullService
from rankguard.monitor.api import StatusFields
from rankguard.monitor.lostnode import LostNode
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import RestartEntry

if TYPE_CHECKING:
    from collections.abc import Callable

    from rankguard.config import RankguardConfig
    from rankguard.launcher.exclusion import NodeExclusion
    from rankguard.launcher.rendezvous import SpareKeeper
    from rankguard.launcher.spares import SpareWatch
    from rankguard.schema.statusblocks import ElasticBlock, Replacement

__all__ = ["ExclusionService", "SpareService", "keep_store_for_spares"]

logger = logging.getLogger(__name__)


class SpareService(NullService):
    """Hot spares and elastic shrink of a multi-node c10d job; node 0's ``elastic`` block."""

    name = "elastic"

    def __init__(self) -> None:
        #: node 0 reads the agents' entries (the launcher holds a client of the store)
        self.track = False
        self.min_nodes = 1
        self.services: Any = None  # the NodeServices: store, run id, node, round
        self.replacements: list[Replacement] = []
        self._agents: tuple[float, list[JsonObject]] | None = None
        #: waiting agents whose beat stopped (spares gone while they waited), as node 0 saw
        self.spares_gone: set[str] = set()
        self._spare_watch: SpareWatch | None = None
        self._keeper: SpareKeeper | None = None
        self._nproc_per_node = 1

    def wrap_rendezvous(self, handler: Any, launch: LaunchContext) -> Any:
        from rankguard.launcher.rendezvous import SpareKeeper, keep_alive_settings
        from rankguard.launcher.spares import KEEPALIVE_S, AgentRegistry

        opts = launch.opts
        self.services = launch.services
        if opts.rdzv_backend != "c10d" or not opts.multi_node or launch.store_client is None:
            return handler
        # the spare's beat at the rendezvous' own keep-alive interval (torch's 5 s default);
        # the agent's entry in the store goes through a client of its own
        interval = keep_alive_settings(opts.rdzv_conf).get("keep_alive_interval", KEEPALIVE_S)
        registry = AgentRegistry(
            launch.store_client(),
            launch.run_id,
            max_nodes=opts.max_nodes,
            min_nodes=opts.min_nodes,
            keepalive_s=float(interval),
        )
        self.track = self.services is not None and self.services.store is not None
        self.min_nodes = opts.min_nodes
        self._nproc_per_node = opts.nproc_per_node
        self._keeper = SpareKeeper(handler, registry, say=launch.say)
        return self._keeper

    def move(self, node: NodeContext) -> None:
        """A new round renumbered this node 0 after its group restarted because a peer
        went away: node 0's monitor was lost with its node, and the new one here never
        saw its ranks. The agents that trained in this node's previous round and did
        not come back are named to it (:mod:`rankguard.monitor.lostnode`), and said."""
        super().move(node)
        self._name_lost(node)

    def regrouped(self, node: NodeContext) -> None:
        """A new round formed and this node stayed node 0 after its group restarted
        because a peer went away: an agent of the previous round that did not come back
        (its node lost, a spare in its place or the job shrunk) is named to the monitor.
        Its rank's heartbeats may have stopped only a moment before the restart, less
        than the monitor's fresh period: the rendezvous, not the timing, says it is gone."""
        self._name_lost(node)

    def _name_lost(self, node: NodeContext) -> None:
        keeper = self._keeper
        if node.node_rank != 0 or node.monitor is None or node.store is None or keeper is None:
            return
        last = _last_restart(node.services)
        if keeper.previous_round is None or last is None or last.reason != "peer_failure":
            return
        from rankguard.launcher.spares import lost_in_round, read_agents

        agents = read_agents(node.store, node.run_id)
        nproc = self._nproc_per_node
        excluded = _excluded_nodes(node.services)
        for entry in lost_in_round(agents, keeper.previous_round, keeper.registry.agent):
            if entry["agent"] in excluded:
                continue  # it left the job on purpose: its exclusion is the finding
            first = int(entry["node"]) * nproc
            lost = LostNode(
                node=int(entry["node"]),
                agent=str(entry["agent"]),
                ranks=tuple(range(first, first + nproc)),
                victim=last.rank,
                restart=f"restart {last.restart}: {last.cause}",
                before_ns=time.time_ns(),
            )
            node.monitor.note_lost_node(lost)
            node.say(lost.said())

    def status_fields(self) -> StatusFields:
        elastic = self.elastic_fields()
        return {} if elastic is None else {elastic.name: elastic}

    def elastic_fields(self) -> ElasticBlock | None:
        """Node 0 of an elastic job: the ``elastic`` block (:mod:`.spares`); the
        agents' entries are read again at most every 2 s (one store round trip each)."""
        node = self.services
        if not self.track or node is None or node.store is None or node.node_rank != 0:
            return None
        from rankguard.launcher.spares import SpareWatch, elastic_status, read_agents

        if self._spare_watch is None:
            self._spare_watch = SpareWatch()
        now = time.monotonic()
        if self._agents is None or now - self._agents[0] >= 2.0:
            self._agents = (now, read_agents(node.store, node.run_id))
            self.spares_gone = self._spare_watch.gone(self._agents[1], now)
        return elastic_status(
            self._agents[1],
            round_tag=node.round_tag,
            nodes=node.round_nodes or node.nnodes,
            min_nodes=self.min_nodes,
            max_nodes=node.nnodes,
            history=self.replacements,
            gone=self.spares_gone,
        )

    def release_store(self, launch: LaunchContext) -> None:
        node = self.services
        if self.track and node is not None:
            keep_store_for_spares(node.store, node.run_id, self.spares_gone, launch.say)


def _excluded_nodes(services: Any) -> set[str]:
    """The agents (``host:pid``) bad-node exclusion took out of the job, where it is on."""
    excluded: set[str] = set()
    for service in getattr(services, "services", None) or []:
        if isinstance(service, ExclusionService) and service.exclusion is not None:
            excluded |= service.exclusion.published_nodes()
    return excluded


def _last_restart(services: Any) -> RestartEntry | None:
    """The node's last restart of its worker group (processes restarted), if any."""
    restarts = getattr(services, "restarts", None) or []
    process = [r for r in restarts if isinstance(r, RestartEntry) and r.kind == "process"]
    return process[-1] if process else None


def _spares(cfg: RankguardConfig) -> SpareService:
    return SpareService()  # the command line decides (c10d, several nodes)


def keep_store_for_spares(
    store: Any,
    run_id: str,
    gone_before: set[str],
    say: Callable[[str], None],
    wait_s: float = 10.0,
) -> None:
    """This node hosts the rendezvous store: the spares still waiting in the
    rendezvous learn that it closed (at their next sync, about a second) before the
    store goes (bounded); without it they would fail on a lost store. A spare whose
    beat stopped (node 0 found it gone: ``gone_before``, or this node sees it now: the
    store's host need not be node 0) is not waited for."""
    from rankguard.launcher.spares import MAX_SPARE_WAIT_S, MISSED_BEATS, SpareWatch, read_agents

    watch = SpareWatch(slack_s=0.5)
    gone = set(gone_before)
    start = time.monotonic()
    deadline = start + wait_s
    while True:
        now = time.monotonic()
        agents = read_agents(store, run_id)
        gone |= watch.gone(agents, now)
        waiting = [a for a in agents if a.get("state") == "waiting" and a["agent"] not in gone]
        if not waiting:
            return
        for a in waiting:  # long enough to see a stopped beat as one
            try:
                keepalive = float(a.get("keepalive_s") or 0.0)
            except (TypeError, ValueError):
                keepalive = 0.0
            deadline = max(deadline, start + MISSED_BEATS * keepalive + watch.slack_s + 1.0)
        if now >= min(deadline, start + MAX_SPARE_WAIT_S):  # entries anyone can write
            break
        time.sleep(0.2)
    say("spares still waiting in the rendezvous: the rendezvous store goes now")


class ExclusionService(NullService):
    """Bad-node exclusion (``fault_tolerance.exclude_bad_nodes``, ``exclude_after_restarts``)."""

    name = "exclusion"

    def __init__(self) -> None:
        self.exclusion: NodeExclusion | None = None

    def wrap_rendezvous(self, handler: Any, launch: LaunchContext) -> Any:
        from rankguard.launcher.exclusion import NodeExclusion

        cfg, opts = launch.cfg, launch.opts
        assert launch.run_dir is not None
        exclusion = self.exclusion = NodeExclusion(
            cfg.fault_tolerance,
            run_id=launch.run_id,
            run_dir=launch.run_dir,
            min_nodes=opts.min_nodes,
            max_nodes=opts.max_nodes,
            store=launch.store_client() if launch.store_client is not None else None,
            command_timeout_s=cfg.heartbeat.hardware_health.command_timeout_s,
            say=launch.say,
        )
        if launch.services is not None:
            exclusion.report = launch.services.report_finding
            exclusion.on_leave = launch.services.last_push
        return exclusion.wrap(handler)

    def attach(self, agent: Any, launch: LaunchContext) -> None:
        exclusion, services = self.exclusion, launch.services
        if exclusion is None:
            return
        agent.attach_exclusion(exclusion)
        exclusion.nproc_per_node = launch.opts.nproc_per_node
        exclusion.write_others = launch.cfg.no_shared_fs
        exclusion.on_shrink = lambda world: (
            services.monitor.retire_ranks(world) if services.monitor is not None else []
        )

    def left(self, error: NodeLeft, handler: Any, launch: LaunchContext) -> None:
        exclusion, services = self.exclusion, launch.services
        if exclusion is None or not error.renumbered:
            return
        if launch.hosting or (services is not None and services.node_rank == 0):
            what = "the rendezvous store" if launch.hosting else "node 0's monitor"
            launch.say(f"excluded; this launcher holds {what}: kept until the job ends")
            exclusion.hold(handler, launch.hosting)

    def closing(self, launch: LaunchContext) -> None:
        if self.exclusion is not None:
            self.exclusion.finish()

    def keeps_store(self, error: NodeLeft | None) -> bool:
        """An excluded node hosting the store, the rendezvous not closed by it: node 0's
        monitor goes on with the others and needs the store."""
        return error is not None and self.exclusion is not None and not self.exclusion.closed_it


def _exclusion(cfg: RankguardConfig) -> ExclusionService | None:
    return ExclusionService() if cfg.fault_tolerance.exclusion else None
