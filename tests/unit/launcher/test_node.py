"""Node identity from the rendezvous: the decision, the store host, the round hook."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

from rankguard.launcher.node import NodeDecision, node_identity
from rankguard.launcher.rendezvous import RoundWatcher, rendezvous_store

pytestmark = pytest.mark.timeout(60)


def test_without_node_rank_the_rendezvous_numbers_the_node() -> None:
    assert node_identity(None, 2, None) == NodeDecision(2, True)
    assert node_identity(1, 1, None) == NodeDecision(1, True)


def test_a_node_rank_the_rendezvous_contradicts_is_said_and_the_rendezvous_wins() -> None:
    d = node_identity(1, 0, None)
    assert (d.node_rank, d.first) == (0, True)
    assert d.warning is not None
    assert d.warning.startswith("--node-rank 1, but the rendezvous numbered this node 0")
    assert "GROUP_RANK" in d.warning


def test_later_rounds_keep_an_unchanged_identity_and_move_a_renumbered_one() -> None:
    assert node_identity(None, 1, 1) == NodeDecision(1, False)
    d = node_identity(None, 0, 1)
    assert (d.node_rank, d.first, d.moved) == (0, False, True)
    assert d.warning is not None and "renumbered this node 1 -> 0" in d.warning
    assert "the job monitor runs here now" in d.warning
    d = node_identity(None, 2, 0)
    assert (d.node_rank, d.moved) == (2, True) and "monitor" not in str(d.warning)


def test_a_negative_group_rank_is_an_error() -> None:
    with pytest.raises(ValueError, match="group rank -1"):
        node_identity(None, -1, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_first_agent_on_the_endpoint_host_hosts_the_store_the_next_joins() -> None:
    # As torch elastic: 127.0.0.1 is this machine, so both agents try to host; the second
    # (another process: TCPStore shares one server per port within a process) cannot
    # bind and joins as a client.
    port = _free_port()
    first, hosts_first = rendezvous_store("127.0.0.1", port, None, timeout_s=5)
    code = (
        "from rankguard.launcher.rendezvous import rendezvous_store\n"
        f"store, hosts = rendezvous_store('127.0.0.1', {port}, None, timeout_s=5)\n"
        "store.set('k', b'v')\n"
        "print('hosts' if hosts else 'joined')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    assert hosts_first
    assert out.stdout.strip() == "joined", out.stderr
    assert first.get("k") == b"v"


def test_a_node_told_not_to_host_with_nobody_hosting_fails_naming_the_endpoint() -> None:
    port = _free_port()
    with pytest.raises(
        RuntimeError, match=f"cannot reach the rendezvous store at 127.0.0.1:{port}"
    ):
        rendezvous_store("127.0.0.1", port, False, timeout_s=1)


def test_an_endpoint_of_another_machine_is_joined_not_hosted() -> None:
    # 192.0.2.1 (TEST-NET-1) is never this machine: torch's rule makes it a client.
    with pytest.raises(RuntimeError, match=r"cannot reach the rendezvous store at 192\.0\.2\.1"):
        rendezvous_store("192.0.2.1", 29400, None, timeout_s=1)


class Inner:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def next_rendezvous(self) -> RendezvousInfo:
        info = RendezvousStoreInfo(master_addr="127.0.0.1", master_port=1)
        return RendezvousInfo(store=None, rank=self.rank, world_size=3, bootstrap_store_info=info)  # type: ignore[arg-type]

    use_agent_store = True

    def __getattr__(self, name: str) -> Any:
        return lambda *a: {"get_backend": "c10d", "get_run_id": "r"}.get(name, 0)


def test_the_round_watcher_tells_each_round_and_delegates_the_rest() -> None:
    seen: list[int] = []
    handler = RoundWatcher(Inner(2), lambda info: seen.append(info.rank))  # type: ignore[arg-type]
    assert handler.next_rendezvous().rank == 2
    handler.next_rendezvous()
    assert seen == [2, 2]
    assert handler.use_agent_store is True
    assert (handler.get_backend(), handler.get_run_id()) == ("c10d", "r")
