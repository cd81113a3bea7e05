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
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousInfo

__all__ = ["FreshStoreRendezvous"]

logger = logging.getLogger(__name__)


class FreshStoreRendezvous(RendezvousHandler):
    def __init__(self, inner: RendezvousHandler, *, timeout_s: float = 300.0) -> None:
        """``inner``: torch's handler, run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
        (it picks the round's free port and shares it through the rendezvous store)."""
        self.inner = inner
        self.timeout_s = timeout_s
        self.server: Any = None  # this round's TCPStore server (node 0's agent only)
        self.rounds = 0

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.inner.next_rendezvous()
        self.rounds += 1
        self.server = None  # the previous round's store: its workers are gone
        if info.rank == 0:
            store_info = info.bootstrap_store_info
            assert store_info is not None
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
