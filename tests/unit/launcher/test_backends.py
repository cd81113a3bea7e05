"""Rendezvous backends other than c10d, built by torch's registry."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from rankguard.launcher.backends import registry_rendezvous, rendezvous_timeout
from rankguard.launcher.options import parse_run_args


def test_rdzv_conf_timeouts_become_torchs_rendezvous_timeout() -> None:
    t = rendezvous_timeout({"join_timeout": "5", "last_call_timeout": "2"}, 5.0)
    assert (t.join, t.last_call) == (timedelta(seconds=5), timedelta(seconds=2))
    with pytest.raises(ValueError, match="close_timeout"):
        rendezvous_timeout({"close_timeout": "soon"}, 1.0)


def test_join_timeout_flag_and_conf_must_agree() -> None:
    opts, _ = parse_run_args(["--rdzv-join-timeout", "7", "t.py"])
    assert opts.rdzv_join_timeout_s == 7.0
    with pytest.raises(ValueError, match="disagree"):
        parse_run_args(["--rdzv-join-timeout", "7", "--rdzv-conf", "join_timeout=8", "t.py"])


def test_the_static_handler_is_torchs_with_the_given_node_rank() -> None:
    opts, _ = parse_run_args(
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.9.9.9",
            "--master-port",
            "1",
            "t.py",
        ]
    )
    handler, host, port = registry_rendezvous(opts, "job")
    assert handler.get_backend() == "static" and (host, port) == ("10.9.9.9", 1)
    assert handler.rank == 1 and handler.world_size == 2 and handler.get_run_id() == "job"


def test_node0_of_a_static_rendezvous_refuses_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        opts, _ = parse_run_args(["--master-addr", "127.0.0.1", "--master-port", str(port), "t.py"])
        with pytest.raises(ValueError, match=f"port {port}.*in use"):
            registry_rendezvous(opts, "job")


def test_an_unknown_backend_is_a_clear_error() -> None:
    opts, _ = parse_run_args(
        ["--nnodes", "2", "--rdzv-backend", "nope", "--rdzv-endpoint", "h:1", "t.py"]
    )
    with pytest.raises(ValueError, match="--rdzv-backend nope"):
        registry_rendezvous(opts, "job")
