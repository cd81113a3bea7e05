"""The contract of a node service: one feature the launcher runs beside a node's workers.

Each feature (GPU health, stragglers, re-runs, in-process restarts, the metrics
exporter, learned timeouts, the checkpoints block, preemption) is one object behind
:class:`NodeService`, built from its configuration section by a factory of
:data:`rankguard.launcher.features.FACTORIES`; a factory returns None when its feature is
off, and :func:`build_services` puts a :class:`NullService` (which does nothing) in its
place. :class:`rankguard.launcher.services.NodeServices` runs the core (node 0's monitor
and stop agreement, the other nodes' relays) and calls every service at each step of the
node's life, in the registry's order:

``start(node)``
    The rendezvous numbered this node. On node 0 the monitor is built but not yet
    scanning: add evaluators, sinks and status sources to ``node.monitor`` here.
``move(node)``
    A new round renumbered the node (node 0 moved): by default :meth:`stop` then
    :meth:`start` as the new number.
``regrouped(node)``
    A new round formed and the node kept its number (its services go on): nothing by
    default.
``leave()``
    The node was excluded from the job (its launcher may stay a while).
``stop()``
    The job ends, before node 0's monitor writes its final status.
``finish(node)``
    After node 0's final status (``node.monitor`` has stopped: its rank states are the
    last ones).
``status_fields()``
    At each scan of node 0's monitor: this service's blocks of ``status.json``.
``outcome(outcome)``
    The job's outcome, which the service may amend (a preemption marks it).

Before the node has a number, the launch itself asks every service, in the same order
(each told the :class:`LaunchContext`):

``check(launch)``
    Before anything is launched: a line naming what cannot work (then the launch stops
    with a usage error), else None.
``preflight(launch)``
    The run directory exists, the workers are not started: an exit code to stop with
    (a GPU check that failed), else None.
``environment(env)``
    The workers' environment, before they (or ``--preload``'s fork server) start.
``wrap_rendezvous(handler, launch)``
    The rendezvous handler the agent will use, wrapped or as it is (hot spares, bad-node
    exclusion); ``launch.services`` is built.
``attach(agent, launch)``
    The agent is built (its failures, its workers).
``left(error, handler, launch)``
    The agent's run ended in a :class:`NodeLeft` (this node left the job).
``closing(launch)``
    The agent's run is over, before the node's services stop.
``keeps_store(error)``
    Whether node 0's monitor may still need the rendezvous store this launcher hosts
    (``error``: the :class:`NodeLeft` the run ended in, if any).
``release_store(launch)``
    This launcher hosts the rendezvous store, which goes next: wait (bounded) for those
    that still need it.

A service never raises out of these calls for a failure of its own feature: it logs it
and goes on (the others and the training must not stop for it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rankguard.monitor.api import StatusFields

if TYPE_CHECKING:
    from rankguard.config import RankguardConfig
    from rankguard.ft.actions import AgentControl
    from rankguard.launcher.exitcodes import JobOutcome
    from rankguard.launcher.options import LaunchOptions
    from rankguard.monitor.monitor import JobMonitor
    from rankguard.schema.cadence import Cadence

__all__ = [
    "LaunchContext",
    "NodeContext",
    "NodeLeft",
    "NodeService",
    "NullService",
    "ServiceFactory",
    "build_services",
]

logger = logging.getLogger(__name__)


@dataclass
class NodeContext:
    """What a service is told about the node when it starts (or moves)."""

    cfg: RankguardConfig
    cadence: Cadence
    run_dir: Path
    run_id: str
    node_rank: int
    nnodes: int
    store: Any  # a client of the rendezvous store (several nodes), else None
    relaying: bool  # other nodes' records come through the store to node 0
    monitor: JobMonitor | None  # node 0 with heartbeats: built, not scanning yet
    #: the stop agreement asks these whether a straggler finding stops the job
    stop_votes: list[Callable[[], bool]] = field(default_factory=list)
    #: the agent (its workers, restarts), once built; services that act on it need it
    agent: AgentControl | None = None
    #: the launcher's console line
    say: Callable[[str], None] = lambda line: None
    #: the node services' facade (:class:`~rankguard.launcher.services.NodeServices`),
    #: for a service that needs what the core offers (the stop agreement, rank states)
    services: Any = None


@dataclass
class LaunchContext:
    """What a service is told about the launch, before the node has a number."""

    opts: LaunchOptions
    cfg: RankguardConfig
    run_id: str
    #: the launcher's console line
    say: Callable[[str], None] = lambda line: None
    run_dir: Path | None = None  # once created
    #: a new client of the rendezvous store (several nodes, the launcher holding the
    #: store), else None
    store_client: Callable[[], Any] | None = None
    hosting: bool = False  # this launcher hosts the rendezvous store
    #: the node services' facade (:class:`~rankguard.launcher.services.NodeServices`),
    #: once built
    services: Any = None


class NodeLeft(Exception):
    """The agent's run ended because this node left the job (a service decided it: bad-node
    exclusion). ``renumbered``: its node number may be another agent's now (its relay
    must halt at once)."""

    renumbered = False


class NodeService(Protocol):
    """One feature of a node, started and stopped with it (see the module's docstring)."""

    name: str

    def start(self, node: NodeContext) -> None: ...

    def move(self, node: NodeContext) -> None: ...

    def regrouped(self, node: NodeContext) -> None: ...

    def leave(self) -> None: ...

    def stop(self) -> None: ...

    def finish(self, node: NodeContext) -> None: ...

    def status_fields(self) -> StatusFields: ...

    def outcome(self, outcome: JobOutcome) -> JobOutcome: ...

    def check(self, launch: LaunchContext) -> str | None: ...

    def preflight(self, launch: LaunchContext) -> int | None: ...

    def environment(self, env: MutableMapping[str, str]) -> None: ...

    def wrap_rendezvous(self, handler: Any, launch: LaunchContext) -> Any: ...

    def attach(self, agent: Any, launch: LaunchContext) -> None: ...

    def left(self, error: NodeLeft, handler: Any, launch: LaunchContext) -> None: ...

    def closing(self, launch: LaunchContext) -> None: ...

    def keeps_store(self, error: NodeLeft | None) -> bool: ...

    def release_store(self, launch: LaunchContext) -> None: ...


class NullService:
    """A feature that is off: every call does nothing. Services subclass it and override
    only the calls they need."""

    name = "off"

    def __init__(self, name: str | None = None) -> None:
        if name is not None:
            self.name = name

    def start(self, node: NodeContext) -> None:
        return None

    def move(self, node: NodeContext) -> None:
        self.stop()
        self.start(node)

    def regrouped(self, node: NodeContext) -> None:
        return None

    def leave(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def finish(self, node: NodeContext) -> None:
        return None

    def status_fields(self) -> StatusFields:
        return {}

    def outcome(self, outcome: JobOutcome) -> JobOutcome:
        return outcome

    def check(self, launch: LaunchContext) -> str | None:
        return None

    def preflight(self, launch: LaunchContext) -> int | None:
        return None

    def environment(self, env: MutableMapping[str, str]) -> None:
        return None

    def wrap_rendezvous(self, handler: Any, launch: LaunchContext) -> Any:
        return handler

    def attach(self, agent: Any, launch: LaunchContext) -> None:
        return None

    def left(self, error: NodeLeft, handler: Any, launch: LaunchContext) -> None:
        return None

    def closing(self, launch: LaunchContext) -> None:
        return None

    def keeps_store(self, error: NodeLeft | None) -> bool:
        return False

    def release_store(self, launch: LaunchContext) -> None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


#: builds a feature's service from the validated configuration; None when it is off
ServiceFactory = Callable[["RankguardConfig"], "NodeService | None"]


def build_services(
    cfg: RankguardConfig, factories: Iterable[tuple[str, ServiceFactory]]
) -> list[NodeService]:
    """One service per registered feature, in the registry's order; a feature that is
    off is a :class:`NullService` named after it."""
    out: list[NodeService] = []
    for name, factory in factories:
        service = factory(cfg)
        out.append(service if service is not None else NullService(name))
    return out
