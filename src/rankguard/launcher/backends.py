"""The rendezvous backends other than c10d, as torch elastic registers them.

``--rdzv-backend static`` (torchrun's default for a multi-node line or one that names
``--master-port``: what a Kubeflow ``PyTorchJob`` gives through ``PET_*``), ``etcd``,
``etcd-v2`` and any backend a package registers are built by torch's own registry from
torchrun's parameters (``--rdzv-endpoint``, ``--rdzv-id``, ``--rdzv-conf``,
``--node-rank`` for static). rankguard's relays then use the store the handler hands out
with each round (``RendezvousInfo.store``), so monitoring and fault tolerance work on
every backend that gives one.

:func:`rendezvous_timeout` reads torchrun's c10d timeouts from ``--rdzv-conf``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankguard.launcher.options import LaunchOptions

__all__ = ["registry_rendezvous", "rendezvous_timeout"]

_TIMEOUT_KEYS = {"join_timeout": "join", "last_call_timeout": "last_call", "close_timeout": "close"}


def rendezvous_timeout(conf: dict[str, Any], join_s: float) -> Any:
    """torch's ``RendezvousTimeout`` from torchrun's ``--rdzv-conf`` keys
    (``join_timeout``, ``last_call_timeout``, ``close_timeout``, in seconds)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    kw: dict[str, timedelta] = {"join": timedelta(seconds=join_s)}
    for key, name in _TIMEOUT_KEYS.items():
        if key in conf:
            try:
                kw[name] = timedelta(seconds=float(conf[key]))
            except (TypeError, ValueError):
                raise ValueError(f"--rdzv-conf {key}: not a number: {conf[key]!r}") from None
    return RendezvousTimeout(**kw)


def _check_port_free(endpoint: str) -> None:
    """Node 0 of a static rendezvous hosts its store on ``--master-port``: a port in use
    is said now, before any worker starts (torch would fail inside the agent)."""
    import errno
    import socket

    from torch.distributed.elastic.rendezvous.utils import (
        _matches_machine_hostname,
        parse_rendezvous_endpoint,
    )

    host, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port <= 0 or not _matches_machine_hostname(host):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"port {port} ({endpoint}) is in use: node 0 of the static rendezvous "
                    "cannot host its store there; choose another --master-port"
                ) from None


def registry_rendezvous(opts: LaunchOptions, run_id: str) -> tuple[Any, str, int]:
    """torch's handler for ``opts.rdzv_backend``, and the endpoint's host and port (for
    the launcher file). A ValueError names what is wrong (an unknown backend, a missing
    package such as python-etcd for ``etcd``)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    params = RendezvousParameters(
        backend=opts.rdzv_backend,
        endpoint=opts.rdzv_endpoint or "",
        run_id=run_id,
        min_nodes=opts.min_nodes,
        max_nodes=opts.max_nodes,
        local_addr=opts.local_addr,
        **opts.rdzv_conf,
    )
    if opts.rdzv_backend == "static" and opts.rdzv_conf.get("rank") == 0:
        _check_port_free(opts.rdzv_endpoint or "")
    try:
        handler = get_rendezvous_handler(params)
    except (ValueError, RuntimeError, ImportError) as exc:
        raise ValueError(f"--rdzv-backend {opts.rdzv_backend}: {exc}") from None
    host, port = parse_rendezvous_endpoint(opts.rdzv_endpoint or "", default_port=29400)
    return handler, host, port
