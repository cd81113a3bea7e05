"""``FreshStoreRendezvous``: each rendezvous round's worker store, hosted by the agent.

The workers' process group needs a TCPStore (``MASTER_ADDR:MASTER_PORT``). Torch
elastic 2.13 offers two ways, both with a cost:

- shared (its default): one store server in the node-0 agent, created at the first
  round and kept for every later one, with no per-attempt prefix. A restarted gloo group
  reads the previous attempt's keys (a dead peer's address): the restart fails or hangs.
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: a fresh free port each round, hosted by the
  workers' global rank 0 once it reaches ``init_process_group``. The other ranks often
  get there first, find nothing listening and retry with back-off: about half a second
  lost at every start and every restart here.

This wrapper keeps the fresh port of the second way and hosts the store in the node-0
agent the moment the round is agreed, like the first: every worker connects as a client
to a store that is already listening and holds nothing from an earlier attempt
(``use_agent_store`` is true, so torch tells the workers not to host one). It wraps the
public ``RendezvousHandler`` interface and delegates everything else; the previous
round's server is closed when the next round starts (its workers are gone by then).

Loopback (``--standalone``): ``TCPStore`` has no bind-address parameter; its server
listens on every interface. It does accept a socket that is already bound and listening
(``master_listen_fd``): :func:`loopback_store_server` binds one to 127.0.0.1, so a
standalone job's stores are not reachable from other machines.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = [
    "LOOPBACK",
    "FreshStoreRendezvous",
    "HandlerWrapper",
    "RoundWatcher",
    "SpareKeeper",
    "keep_alive_settings",
    "loopback_store_server",
    "rendezvous_store",
]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

KEEP_ALIVE_KEYS = ("keep_alive_interval", "keep_alive_max_attempt")
"""torchrun's ``--rdzv-conf`` keys for the c10d rendezvous' keep-alive: a node whose
last keep-alive is older than ``interval * max_attempt`` is dead, removed from the round
(torch's defaults: 5 s, 3 attempts: a lost node is noticed after 15 s)."""


def keep_alive_settings(conf: dict[str, Any]) -> dict[str, Any]:
    """The keep-alive arguments of ``DynamicRendezvousHandler.from_backend`` from
    ``--rdzv-conf`` (only the keys given; torch's defaults otherwise).

    ``keep_alive_interval`` may be a fraction of a second here (torch's own parser takes
    whole seconds; the handler itself takes any ``timedelta``): the time to notice a lost
    node is ``interval * max_attempt``, what a spare waits before it takes the place."""
    out: dict[str, Any] = {}
    if "keep_alive_interval" in conf:
        try:
            interval = float(conf["keep_alive_interval"])
        except (TypeError, ValueError):
            interval = -1.0
        if not 0 < interval <= 3600:
            raise ValueError(
                "--rdzv-conf keep_alive_interval: seconds in (0, 3600], got "
                f"{conf['keep_alive_interval']!r}"
            )
        out["keep_alive_interval"] = interval
    if "keep_alive_max_attempt" in conf:
        try:
            attempts = int(str(conf["keep_alive_max_attempt"]))
        except ValueError:
            attempts = 0
        if attempts < 1:
            raise ValueError(
                "--rdzv-conf keep_alive_max_attempt: a whole number >= 1, got "
                f"{conf['keep_alive_max_attempt']!r}"
            )
        out["keep_alive_max_attempt"] = attempts
    return out


def loopback_store_server(
    port: int = 0, *, timeout_s: float = 300.0, multi_tenant: bool = False
) -> TCPStore:
    """A TCPStore server that listens on 127.0.0.1 only (``port`` 0: a free one; read
    the store's ``port``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(socket.SOMAXCONN)
        bound = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the listening socket from here on
    try:
        return TCPStore(
            host_name=LOOPBACK,
            port=bound,
            is_master=True,
            wait_for_workers=False,
            multi_tenant=multi_tenant,
            master_listen_fd=fd,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception:
        os.close(fd)
        raise


class HandlerWrapper(RendezvousHandler):
    """A rendezvous handler around another (torch elastic's, or another wrapper): every
    call goes to ``inner``; a wrapper overrides what it adds to. Wrappers nest
    (``inner`` is how the chain is walked)."""

    def __init__(self, inner: RendezvousHandler) -> None:
        self.inner = inner

    def next_rendezvous(self) -> RendezvousInfo:
        return self.inner.next_rendezvous()

    @property
    def use_agent_store(self) -> bool:
        return bool(self.inner.use_agent_store)

    def get_backend(self) -> str:
        return self.inner.get_backend()

    def is_closed(self) -> bool:
        return self.inner.is_closed()

    def set_closed(self) -> None:
        self.inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self.inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self.inner.get_run_id()

    def shutdown(self) -> bool:
        return self.inner.shutdown()


class FreshStoreRendezvous(HandlerWrapper):
    def __init__(
        self, inner: RendezvousHandler, *, timeout_s: float = 300.0, loopback: bool = False
    ) -> None:
        """``inner``: torch's handler, run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
        (it picks the round's free port and shares it through the rendezvous store).
        ``loopback``: the round's store listens on 127.0.0.1 only (``--standalone``)."""
        super().__init__(inner)
        self.timeout_s = timeout_s
        self.loopback = loopback
        self.server: Any = None  # this round's TCPStore server (node 0's agent only)
        self.rounds = 0

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.inner.next_rendezvous()
        self.rounds += 1
        self.server = None  # the previous round's store: its workers are gone
        if info.rank == 0:
            store_info = info.bootstrap_store_info
            assert store_info is not None
            if self.loopback:
                self.server = loopback_store_server(
                    store_info.master_port, timeout_s=self.timeout_s
                )
            else:
                self.server = TCPStore(
                    host_name=store_info.master_addr,
                    port=store_info.master_port,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=timedelta(seconds=self.timeout_s),
                )
            logger.debug(
                "rankguard: round %d worker store hosted by the agent on port %d",
                self.rounds,
                store_info.master_port,
            )
        return info

    @property
    def use_agent_store(self) -> bool:
        return True

    def shutdown(self) -> bool:
        self.server = None
        return self.inner.shutdown()


def rendezvous_store(
    host: str, port: int, is_host: bool | None, *, timeout_s: float = 60.0
) -> tuple[TCPStore, bool]:
    """The c10d rendezvous store at ``host:port`` and whether this process hosts it.

    As torch elastic's c10d backend chooses (``_create_tcp_store``): ``is_host`` given,
    it is obeyed; otherwise this node hosts the store when ``host`` is one of this
    machine's names or addresses (torch's own ``_matches_machine_hostname``), and if that
    fails to bind (another agent on this machine was first: several agents on one
    host, as on loopback) it joins as a client. Torch's backend does not say which it
    did; rankguard needs to know, because the store must outlive node 0's monitor."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    guessed = is_host is None
    first = _matches_machine_hostname(host) if guessed else bool(is_host)
    for server in dict.fromkeys([first, False]):
        try:
            store = TCPStore(
                host,
                port,
                is_master=server,
                multi_tenant=True,
                timeout=timedelta(seconds=timeout_s),
            )
        except (ValueError, RuntimeError, TimeoutError) as exc:
            if not server or not guessed:
                raise RuntimeError(
                    f"cannot {'host' if server else 'reach'} the rendezvous store at "
                    f"{host}:{port}: {exc}"
                ) from exc
            logger.info("rendezvous store: %s:%d is hosted by another agent here", host, port)
            continue
        return store, server
    raise AssertionError("unreachable")


class RoundWatcher(HandlerWrapper):
    """Torch elastic's handler, unchanged, plus a call of ``on_round(info)`` after each
    completed round: the agent's group rank in ``info.rank`` is this node's identity
    (torch numbers the nodes of a round; ``--node-rank`` is not needed)."""

    def __init__(
        self, inner: RendezvousHandler, on_round: Callable[[RendezvousInfo], None]
    ) -> None:
        super().__init__(inner)
        self.on_round = on_round

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.inner.next_rendezvous()
        self.on_round(info)
        return info


def round_tag(info: RendezvousInfo) -> str | None:
    """A name of the round ``info`` belongs to, the same on every node of it: the
    round's worker store (a fresh port each round, see :class:`FreshStoreRendezvous`)."""
    store_info = info.bootstrap_store_info
    if store_info is None:
        return None
    return f"{store_info.master_addr}:{store_info.master_port}"


class SpareKeeper(HandlerWrapper):
    """Torch elastic's c10d handler for a job with hot spares (agents beyond
    ``max_nodes``) and elastic shrink; everything else delegated unchanged.

    - ``num_nodes_waiting``: torch's agent restarts a healthy group whenever a node
      waits for the next round, to let it in. A node can only join a round that has
      room: while this group has ``max_nodes`` nodes a waiting agent is a spare, and a
      restart for it would only put it back in the queue (torch keeps an agent that
      queued while the round was filling on the wait list, and every restart queues one
      again: the group restarts for ever). So: 0 while the group is full, torch's
      count while it is smaller (a shrunk job grows back when a node comes).
    - ``next_rendezvous``: the agent says it waits, then what it became, in its entry
      of the rendezvous store (:class:`~rankguard.launcher.spares.AgentRegistry`). A
      spare that torch put on the wait list meets torch's join timeout; when a full
      round trains without it, it waits again instead of failing (torch then keeps it
      in the redundancy list, which has no timeout).
    - the job's end, however it reaches a waiting spare: torch ends a spare in its
      redundancy list gracefully when the rendezvous closes, but a spare on its wait
      list gets ``RendezvousClosedError`` instead (a node's keep-alive late by
      ``keep_alive_interval x keep_alive_max_attempt`` drops it from the round and moves
      the spares there: a busy host is enough), and a spare may also find the store
      gone or time out after the job ended. Once the job's end marker is seen
      (:func:`~rankguard.launcher.spares.spare_not_needed`), each of these is a
      ``RendezvousGracefulExitError``: the launcher says the spare was not needed and
      exits 0. Without the marker (a store lost mid-job, a closed rendezvous id) the
      error is raised as torch raised it.
    - ``shutdown``: an agent that trained marks the job's end in the store before the
      rendezvous closes; a spare that left waiting closes nothing (the rendezvous is
      closed, or its store gone, already).
    """

    def __init__(
        self,
        inner: RendezvousHandler,
        registry: Any,
        *,
        say: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.registry = registry
        self.say = say or (lambda msg: logger.info("rankguard: %s", msg))
        self.nodes: int | None = None  # the current group's node count
        self.left_waiting = False  # the job ended while this agent waited
        #: the tag of the round this agent trained in before the current one (None: none)
        self.previous_round: str | None = None

    def next_rendezvous(self) -> RendezvousInfo:
        from torch.distributed.elastic.rendezvous.api import (
            RendezvousGracefulExitError,
            RendezvousTimeoutError,
        )

        from rankguard.launcher.spares import full_round_without, read_agents

        self.nodes = None
        self.registry.waiting()
        while True:
            try:
                info = self.inner.next_rendezvous()
                break
            except RendezvousGracefulExitError:
                # the job ended while this agent waited (a spare never needed): torch's
                # agent returns no result; the launcher says so and exits 0
                self._not_needed()
                raise
            except RendezvousTimeoutError as exc:
                agents = read_agents(self.registry.store, self.registry.run_id)
                self._raise_if_not_needed(exc, agents)
                if not full_round_without(agents, self.registry.agent, self.registry.max_nodes):
                    self.registry.left()
                    raise
                self.say(
                    f"a full round of {self.registry.max_nodes} node(s) trains: this agent "
                    "waits on as a spare"
                )
            except Exception as exc:
                # closed, or its store lost: after the job's end, a spare not needed;
                # otherwise this agent's run ends, it no longer waits (nor beats: the
                # store's host would otherwise wait for it as for a spare)
                self._raise_if_not_needed(exc)
                self.registry.left()
                raise
            except BaseException:
                self.registry.left()
                raise
        self.nodes = int(info.world_size)
        trained_in = self.registry.entry.get("round")
        self.previous_round = trained_in if isinstance(trained_in, str) else None
        self.registry.joined(int(info.rank), self.nodes, round_tag(info))
        return info

    def _not_needed(self) -> None:
        self.left_waiting = True
        self.registry.left()

    def _raise_if_not_needed(
        self, exc: Exception, agents: list[dict[str, Any]] | None = None
    ) -> None:
        """The job ended while this agent waited as a spare: torch's graceful end.
        ``agents``: the entries, read here only once the job's end was seen."""
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.rendezvous.api import RendezvousGracefulExitError

        from rankguard.launcher.spares import read_agents, spare_not_needed

        if isinstance(exc, SignalException) or not self.registry.job_ended():
            return  # a signal stops the launcher as it would have
        if agents is None:
            agents = read_agents(self.registry.store, self.registry.run_id)
        if not spare_not_needed(self.registry, agents):
            return
        logger.debug("rankguard: the job ended while this spare waited: %r", exc)
        self._not_needed()
        raise RendezvousGracefulExitError(
            f"the job ended while this agent waited as a spare ({type(exc).__name__})"
        ) from exc

    def shutdown(self) -> bool:
        if self.left_waiting:
            return True  # closed already, or its store gone: nothing to close
        if self.registry.trained():
            self.registry.job_ends()
        return self.inner.shutdown()

    def num_nodes_waiting(self) -> int:
        waiting = self.inner.num_nodes_waiting()
        if self.nodes is not None and self.nodes >= self.registry.max_nodes:
            return 0  # a full group: whoever waits is a spare
        return waiting
