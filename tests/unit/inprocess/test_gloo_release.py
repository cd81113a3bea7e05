"""A gloo collective blocked on a live peer is released when its round fails: the
round's group sockets are shut down (:mod:`rankguard.inprocess.sockets`), not waited
out to the group's timeout. Ranks as processes on gloo."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.factories import run_ranks

pytestmark = pytest.mark.ranks

GROUP_TIMEOUT_S = 20.0


def _blocked_then_released(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from rankguard.inprocess.sockets import shutdown_sockets, tcp_sockets

    before = tcp_sockets()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    mine = tcp_sockets() - before
    if rank == world - 1:  # alive, never enters the collective (a peer stopped elsewhere)
        time.sleep(8.0)  # past the bound below: its exit would close them too
        return {"sockets": len(mine)}
    timer = threading.Timer(0.5, shutdown_sockets, args=(mine,))
    timer.start()
    start = time.monotonic()
    error = ""
    try:
        dist.all_reduce(torch.ones(4), group=group)
    except RuntimeError as exc:
        error = str(exc)[:200]
    timer.join()
    return {"sockets": len(mine), "waited_s": time.monotonic() - start, "error": error}


@pytest.mark.timeout(60)
def test_a_collective_waiting_on_a_live_peer_fails_once_its_sockets_are_shut(
    tmp_path: Path,
) -> None:
    results = run_ranks(3, _blocked_then_released, store_dir=tmp_path, timeout_s=50)
    for result in results:
        assert result["sockets"] >= 2  # a connection to each peer
    for result in results[:2]:
        assert result["error"], result
        assert result["waited_s"] < 5.0, result  # not the group's 20 s timeout


def test_a_socket_closed_or_replaced_meanwhile_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the listing of the descriptors and the shutdown the group may close one
    (its own teardown) and the number may then hold another socket: neither is an error
    and the other socket keeps working."""
    import os
    import socket

    import rankguard.inprocess.sockets as sockets

    a, b = socket.socketpair()
    gone = os.fstat(a.fileno()).st_ino
    c, d = socket.socketpair()
    with a, b, c, d:
        monkeypatch.setattr(sockets, "_socket_fds", lambda: {gone: c.fileno()})
        assert sockets.shutdown_sockets(frozenset({gone})) == 0
        c.sendall(b"x")
        assert d.recv(1) == b"x"
        closed = os.dup(b.fileno())
        os.close(closed)
        monkeypatch.setattr(sockets, "_socket_fds", lambda: {gone: closed})
        assert sockets.shutdown_sockets(frozenset({gone})) == 0


def test_a_gloo_error_out_of_ddps_backward_is_a_collective_error_not_the_cause() -> None:
    """A survivor's all-reduce inside DDP's backward fails in the autograd engine (no
    torch.distributed frame): gloo's message says it, so the rank that raised is named
    the culprit, not the lowest rank whose collective broke."""
    from rankguard.inprocess.wrapper import _raised_in_collective

    closed = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:32164."
    )
    assert _raised_in_collective(closed)
    assert not _raised_in_collective(RuntimeError("the script's own error"))
    assert not _raised_in_collective(ValueError("gloo/transport/ in a user's message"))
