"""FreshStoreRendezvous: a fresh worker store per round, hosted by the node-0 agent."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

from rankguard.launcher.rendezvous import FreshStoreRendezvous, loopback_store_server

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeHandler:
    """torch's handler with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: a new free port a round."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ports: list[int] = []
        self.calls: list[str] = []

    def next_rendezvous(self) -> RendezvousInfo:
        port = _free_port()
        self.ports.append(port)
        info = RendezvousStoreInfo(master_addr="127.0.0.1", master_port=port)
        return RendezvousInfo(store=None, rank=self.rank, world_size=2, bootstrap_store_info=info)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            return {"get_backend": "c10d", "get_run_id": "r", "num_nodes_waiting": 3}.get(
                name, True
            )

        return call


def _client(port: int, timeout_s: float = 5.0) -> TCPStore:
    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))


def test_node0_hosts_each_rounds_store_before_any_worker_connects() -> None:
    inner = FakeHandler(rank=0)
    handler = FreshStoreRendezvous(inner)  # type: ignore[arg-type]
    assert handler.use_agent_store  # workers are told to connect, never to host
    info = handler.next_rendezvous()
    assert info.bootstrap_store_info.master_port == inner.ports[0]
    worker = _client(inner.ports[0])  # listening already: no connect retry
    worker.set("default_pg/0//cpu//0/0", b"attempt-0 address")
    handler.next_rendezvous()  # a restart: new round, new port, empty store
    assert inner.ports[1] != inner.ports[0]
    fresh = _client(inner.ports[1])
    assert fresh.check(["default_pg/0//cpu//0/0"]) is False  # no stale peer address
    with pytest.raises(RuntimeError):  # the previous round's server is gone
        _client(inner.ports[0], timeout_s=1.0)


def test_other_nodes_host_nothing() -> None:
    inner = FakeHandler(rank=1)
    handler = FreshStoreRendezvous(inner)  # type: ignore[arg-type]
    handler.next_rendezvous()
    assert handler.server is None


def test_everything_else_is_delegated() -> None:
    inner = FakeHandler(rank=1)
    handler = FreshStoreRendezvous(inner)  # type: ignore[arg-type]
    assert handler.get_backend() == "c10d" and handler.get_run_id() == "r"
    assert handler.num_nodes_waiting() == 3 and handler.is_closed() is True
    handler.set_closed()
    assert handler.shutdown() is True
    assert inner.calls == [
        "get_backend",
        "get_run_id",
        "num_nodes_waiting",
        "is_closed",
        "set_closed",
        "shutdown",
    ]


def _listening_on(port: int) -> list[str]:
    """Local addresses (hex, as the kernel lists them) of the sockets listening on
    ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text(encoding="ascii").splitlines()[1:]:
            cols = line.split()
            addr, _, hex_port = cols[1].rpartition(":")
            if cols[3] == "0A" and int(hex_port, 16) == port:
                found.append(addr)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_loopback_store_server_listens_on_loopback_only() -> None:
    server = loopback_store_server(0, timeout_s=5.0, multi_tenant=True)
    assert _listening_on(server.port) == ["0100007F"]  # 127.0.0.1, no wildcard socket
    client = _client(server.port)
    client.set("k", b"v")
    assert server.get("k") == b"v"


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_standalone_rounds_store_listens_on_loopback_only() -> None:
    inner = FakeHandler(rank=0)
    handler = FreshStoreRendezvous(inner, loopback=True)  # type: ignore[arg-type]
    handler.next_rendezvous()
    assert _listening_on(inner.ports[0]) == ["0100007F"]
    _client(inner.ports[0]).set("k", b"v")
    plain = FreshStoreRendezvous(FakeHandler(rank=0))  # type: ignore[arg-type]
    plain.next_rendezvous()
    assert "0100007F" not in _listening_on(plain.server.port)  # torch's own: every interface
