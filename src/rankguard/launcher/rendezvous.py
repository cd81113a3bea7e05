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
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = ["LOOPBACK", "FreshStoreRendezvous", "loopback_store_server"]

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
