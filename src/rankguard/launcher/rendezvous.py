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
    "RoundWatcher",
    "loopback_store_server",
    "rendezvous_store",
]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


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


class FreshStoreRendezvous(RendezvousHandler):
    def __init__(
        self, inner: RendezvousHandler, *, timeout_s: float = 300.0, loopback: bool = False
    ) -> None:
        """``inner``: torch's handler, run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
        (it picks the round's free port and shares it through the rendezvous store).
        ``loopback``: the round's store listens on 127.0.0.1 only (``--standalone``)."""
        self.inner = inner
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
            logger.info(
                "rankguard: round %d worker store hosted by the agent on port %d",
                self.rounds,
                store_info.master_port,
            )
        return info

    @property
    def use_agent_store(self) -> bool:
        return True

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


class RoundWatcher(RendezvousHandler):
    """Torch elastic's handler, unchanged, plus a call of ``on_round(info)`` after each
    completed round: the agent's group rank in ``info.rank`` is this node's identity
    (torch numbers the nodes of a round; ``--node-rank`` is not needed)."""

    def __init__(
        self, inner: RendezvousHandler, on_round: Callable[[RendezvousInfo], None]
    ) -> None:
        self.inner = inner
        self.on_round = on_round

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.inner.next_rendezvous()
        self.on_round(info)
        return info

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
