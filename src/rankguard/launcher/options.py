"""What ``rankguard run`` was asked to launch (torchrun's flag names where they exist)."""

from __future__ import annotations

import argparse
import re
import secrets
import time
from dataclasses import dataclass, field

__all__ = [
    "LaunchOptions",
    "add_launch_arguments",
    "is_override",
    "options_from_args",
    "split_overrides",
]

# ``a.b=value``, and Hydra's ``+a.b=value`` / ``++a.b=value`` (add or force: the same here)
_OVERRIDE_RE = re.compile(r"^\+{0,2}[A-Za-z_][A-Za-z0-9_.]*=")


def is_override(word: str) -> bool:
    """A ``KEY=VALUE`` config override word (not a script path)."""
    return bool(_OVERRIDE_RE.match(word)) and not word.endswith(".py")


@dataclass(kw_only=True, slots=True)
class LaunchOptions:
    target: str
    target_args: list[str] = field(default_factory=list)
    module: bool = False
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    # None: told by the rendezvous (torch elastic's group rank), as under torchrun
    node_rank: int | None = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_join_timeout_s: float = 600.0
    max_restarts: int = 0
    monitor_interval_s: float = 0.1
    standalone: bool = False
    live_status: bool = False
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node: must be >= 1, got {self.nproc_per_node}")
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ValueError(
                f"--nnodes: need 1 <= min <= max, got {self.min_nodes}:{self.max_nodes}"
            )
        if self.node_rank is not None and not 0 <= self.node_rank < self.max_nodes:
            raise ValueError(f"--node-rank: must be in [0, {self.max_nodes}), got {self.node_rank}")
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts: must be >= 0, got {self.max_restarts}")
        for name in self.preload:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
                raise ValueError(f"--preload: {name!r} is not a module name")
        if self.max_nodes > 1:
            if self.standalone:
                raise ValueError("--standalone: only for a single node (--nnodes 1)")
            if not self.rdzv_endpoint:
                raise ValueError("--rdzv-endpoint HOST:PORT is required with several nodes")
            if not self.rdzv_id:
                raise ValueError(
                    "--rdzv-id is required with several nodes: every node must name the same run"
                )

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def expected_world_size(self) -> int | None:
        if self.min_nodes != self.max_nodes:
            return None  # elastic: learnt from the ranks' records
        return self.max_nodes * self.nproc_per_node

    def run_id(self) -> str:
        if self.rdzv_id:
            return self.rdzv_id
        return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _parse_nnodes(text: str) -> tuple[int, int]:
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            return int(lo), int(hi)
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nnodes: expected N or MIN:MAX, got {text!r}") from None
    return n, n


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("launch (torchrun-compatible names)")
    g.add_argument("--nnodes", default="1", help="N or MIN:MAX nodes (default 1)")
    g.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    g.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=None,
        help="this node's rank, 0..N-1 (optional: the rendezvous numbers the nodes, as "
        "under torchrun; when given, it is checked against the rendezvous' number and "
        "node 0 hosts the rendezvous store)",
    )
    g.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None, help="HOST:PORT")
    g.add_argument("--rdzv-id", "--rdzv_id", "--run-id", dest="rdzv_id", default=None)
    g.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        default="c10d",
        choices=["c10d"],
        help="only c10d: it restarts reliably and carries the heartbeat relay",
    )
    g.add_argument("--rdzv-join-timeout", type=float, default=600.0, dest="rdzv_join_timeout")
    g.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
    g.add_argument("--monitor-interval", "--monitor_interval", type=float, default=0.1)
    g.add_argument("--standalone", action="store_true", help="single node, local rendezvous")
    g.add_argument("--master-addr", "--master_addr", default=None, help="alias: rdzv host")
    g.add_argument("--master-port", "--master_port", type=int, default=None, help="rdzv port")
    p.add_argument(
        "--preload",
        default="",
        metavar="MODULES",
        help="comma-separated modules (e.g. torch) imported once by a fork server that "
        "then forks every rank, at start and at each restart, instead of starting a new "
        "interpreter per rank; the modules must not initialise CUDA",
    )
    p.add_argument("--config", default=None, help="YAML config file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="config override (repeatable); bare KEY=VALUE words before the script work too",
    )
    p.add_argument("--log-dir", default=None, help="shortcut for log_dir=...")
    p.add_argument("-m", "--module", action="store_true", help="run TARGET as a module")
    p.add_argument("target", help="training script (or module with -m) then its arguments")
    p.add_argument("target_args", nargs=argparse.REMAINDER)


def split_overrides(target: str, rest: list[str]) -> tuple[list[str], str, list[str]]:
    """Leading ``a.b=value`` words before the script are config overrides."""
    words = [target, *rest]
    overrides = []
    while words and is_override(words[0]):
        overrides.append(words.pop(0))
    if not words:
        raise ValueError("no training script given after the config overrides")
    return overrides, words[0], words[1:]


def options_from_args(args: argparse.Namespace) -> tuple[LaunchOptions, list[str]]:
    overrides, target, target_args = split_overrides(args.target, list(args.target_args))
    lo, hi = _parse_nnodes(args.nnodes)
    endpoint = args.rdzv_endpoint
    if endpoint is None and args.master_addr:
        endpoint = f"{args.master_addr}:{args.master_port or 29500}"
    opts = LaunchOptions(
        target=target,
        target_args=target_args,
        module=args.module,
        min_nodes=lo,
        max_nodes=hi,
        nproc_per_node=args.nproc_per_node,
        node_rank=args.node_rank if args.node_rank is not None or hi > 1 else 0,
        rdzv_endpoint=endpoint,
        rdzv_id=args.rdzv_id,
        rdzv_join_timeout_s=args.rdzv_join_timeout,
        max_restarts=args.max_restarts,
        monitor_interval_s=args.monitor_interval,
        standalone=args.standalone or (hi == 1 and endpoint is None),
        preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
    )
    all_overrides = [*args.overrides, *overrides]
    if args.log_dir:
        all_overrides.insert(0, f"log_dir={args.log_dir}")
    return opts, all_overrides
