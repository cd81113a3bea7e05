"""What ``rankguard run`` was asked to launch: torchrun's command line, with its meaning.

The parser is torch's own (``torch.distributed.run.get_args_parser()``), extended with
rankguard's flags: every flag of the installed torch works, with both spellings, its
default and its ``PET_<FLAG>`` variable (torch's ``env`` action; an explicit flag wins),
and a flag a later torch adds works unchanged. The launch itself is decided by torch's
``config_from_args`` after torchrun's own rule for a single node without an endpoint
(``torch.distributed.run.run``): a local c10d rendezvous on a free port. So nproc
(``auto``/``cpu``/``gpu``/``xpu``/N), ``OMP_NUM_THREADS``, the log specs, the
rendezvous backend, endpoint and config are what torchrun would use.

Where torchrun and rankguard both have a meaning for a flag, torchrun's wins:
``--log-dir`` is torchrun's directory of per-rank log files (it also roots rankguard's
run files when the configuration sets no ``log_dir``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from rankguard.launcher.argv import is_override, split_overrides

__all__ = [
    "ENTRY_NO_PYTHON",
    "ENTRY_PYTHON",
    "ENTRY_RUN_PATH",
    "RANK_PREFIX_TEMPLATE",
    "LaunchOptions",
    "add_rankguard_arguments",
    "build_run_parser",
    "is_override",
    "options_from_args",
    "parse_run_args",
    "split_overrides",
]

ENTRY_PYTHON = "python"  # python -u [-m] TARGET, through rankguard's bootstrap
ENTRY_NO_PYTHON = "no-python"  # TARGET executed directly (--no-python)
ENTRY_RUN_PATH = "run-path"  # runpy.run_path in a process torch starts (--run-path)

RANK_PREFIX_TEMPLATE = "[node$node rank${rank}]: "
"""``--rank-prefix``: each console line of a rank starts with its node and global rank
(``$node`` is rankguard's, the rest torch elastic's template macros)."""

_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(kw_only=True, slots=True)
class LaunchOptions:
    target: str
    target_args: list[str] = field(default_factory=list)
    module: bool = False
    entry: str = ENTRY_PYTHON
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    # None: told by the rendezvous (torch elastic's group rank), as under torchrun
    node_rank: int | None = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: dict[str, Any] = field(default_factory=dict)
    rdzv_join_timeout_s: float = 600.0
    max_restarts: int = 0
    monitor_interval_s: float = 0.1
    start_method: str = "spawn"
    role: str = "default"
    local_addr: str | None = None
    standalone: bool = False
    live_status: bool = False
    rank_prefix: bool = False
    line_prefix_template: str | None = None
    preload: tuple[str, ...] = ()
    logs_specs: Any = None  # torch elastic's LogsSpecs (torchrun's --log-dir/-r/-t/...)
    elastic: Any = None  # torch's LaunchConfig for everything else torchrun passes on
    notes: tuple[str, ...] = ()  # torchrun's warnings about the line, one line each
    # torchrun's --shutdown-timeout / TORCH_ELASTIC_SHUTDOWN_TIMEOUT, when given (else
    # fault_tolerance.termination_grace_s)
    shutdown_timeout_s: int | None = None

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
        if self.entry not in (ENTRY_PYTHON, ENTRY_NO_PYTHON, ENTRY_RUN_PATH):
            raise ValueError(f"entry: unknown {self.entry!r}")
        if self.module and self.entry == ENTRY_NO_PYTHON:
            raise ValueError("--no-python and --module cannot be used together (as in torchrun)")
        for name in self.preload:
            if not _MODULE_RE.fullmatch(name):
                raise ValueError(f"--preload: {name!r} is not a module name")
        if self.preload and self.entry != ENTRY_PYTHON:
            raise ValueError(f"--preload: not with --{self.entry} (the ranks are not forked)")
        if self.max_nodes > 1:
            if self.standalone:
                raise ValueError("--standalone: only for a single node (--nnodes 1)")
            if not self.rdzv_endpoint:
                raise ValueError("--rdzv-endpoint HOST:PORT is required with several nodes")

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def expected_world_size(self) -> int | None:
        if self.min_nodes != self.max_nodes:
            return None  # elastic: learnt from the ranks' records
        return self.max_nodes * self.nproc_per_node

    @property
    def default_run_id(self) -> bool:
        """Several nodes with torchrun's default run id (``none``): the same for every
        launch of the job, so it cannot name a run directory of its own."""
        return self.multi_node and self.rdzv_id in (None, "none")

    def run_id(self) -> str:
        if self.rdzv_id and self.rdzv_id != "none":
            return self.rdzv_id
        if self.multi_node:
            return "none"  # torchrun's default id: every node must agree on it
        return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def add_rankguard_arguments(p: argparse.ArgumentParser) -> None:
    """rankguard's own flags, added to torch's parser (none collides with torchrun's)."""
    g = p.add_argument_group("rankguard")
    g.add_argument(
        "--config",
        default=os.environ.get("PET_CONFIG") or None,
        help="YAML config file (env PET_CONFIG)",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="config override (repeatable); bare KEY=VALUE words before the script work too",
    )
    g.add_argument(
        "--preload",
        default=os.environ.get("PET_PRELOAD", ""),
        metavar="MODULES",
        help="comma-separated modules (e.g. torch) imported once by a fork server that "
        "then forks every rank, at start and at each restart, instead of starting a new "
        "interpreter per rank; the modules must not initialise CUDA (env PET_PRELOAD)",
    )
    g.add_argument(
        "--standby-ranks",
        type=int,
        default=None,
        metavar="K",
        help="K warm standby worker processes per node: a rank whose process is lost is "
        "replaced in place by one, without a group restart (the same as --set "
        "inprocess_restart.standby_ranks=K; needs in-process restart; with --preload "
        "the standbys are forked from the fork server too)",
    )
    g.add_argument(
        "--live",
        action="store_true",
        default=os.environ.get("PET_LIVE", "") in ("1", "true"),
        help="show a live status line (node 0; env PET_LIVE=1)",
    )
    g.add_argument(
        "--rank-prefix",
        action="store_true",
        default=os.environ.get("PET_RANK_PREFIX", "") in ("1", "true"),
        help="prefix each console line of a rank with its node and global rank (tees "
        "every stream into torchrun's per-rank files, read with 'rankguard logs'; "
        "env PET_RANK_PREFIX=1)",
    )
    g.add_argument(
        "--run-id",
        dest="run_id_alias",
        default=None,
        help="the run's name: the same as --rdzv-id",
    )
    g.add_argument(
        "--rdzv-join-timeout",
        type=float,
        default=None,
        dest="rdzv_join_timeout",
        help="seconds a node waits for the others (the same as --rdzv-conf join_timeout=S)",
    )


class _RunParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, no usage block: what is wrong and where to look."""
        self.exit(2, f"{self.prog}: {message} (see: {self.prog} --help)\n")


def build_run_parser() -> argparse.ArgumentParser:
    """torch's torchrun parser plus rankguard's flags (imports torch). torch's actions
    are taken as they are (``parents``): names, defaults, ``PET_*`` variables."""
    from torch.distributed.run import get_args_parser

    p = _RunParser(
        prog="rankguard run",
        description="Launch SCRIPT with torch.distributed.elastic, as torchrun does "
        "(every torchrun flag, PET_* variables), plus rankguard's monitoring. Config: "
        "--config FILE plus KEY=VALUE overrides, given with --set or as bare words "
        "before SCRIPT.",
        parents=[get_args_parser()],
        add_help=False,
    )
    add_rankguard_arguments(p)
    return p


def _torchrun_rule(args: argparse.Namespace) -> bool:
    """``torch.distributed.run.run``'s own rewrite before ``config_from_args``: a
    standalone or single-node static job without an endpoint gets a local c10d
    rendezvous on a free port. True when the job is local (rankguard's standalone)."""
    local = False
    if args.standalone:
        local = True
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        min_max = str(args.nnodes).split(":")
        local = int(min_max[-1]) == 1
    if local:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
    if args.master_port is None:
        args.master_port = 29500
    return local


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().replace("*", " ").split())
        if text:
            self.into.append(text)


@contextlib.contextmanager
def _torch_warnings(into: list[str]) -> Iterator[None]:
    """torchrun's warnings while it reads the line (OMP_NUM_THREADS, an unused
    ``--master-addr``...), collected as one line each instead of torch's banners: the
    launcher says them after its own first line."""
    log = logging.getLogger("torch.distributed.run")
    handler, propagate = _Collect(into), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


def _shutdown_timeout(args: argparse.Namespace) -> int | None:
    if args.shutdown_timeout is not None:
        return int(args.shutdown_timeout)
    env = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    return int(env) if env and env.strip().isdigit() else None


def _check_torch_values(args: argparse.Namespace) -> None:
    """What torch's ``config_from_args`` asserts, said with the flag's name."""
    from torch.distributed.run import parse_min_max_nnodes

    try:
        lo, hi = parse_min_max_nnodes(str(args.nnodes))
    except (ValueError, RuntimeError):
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {args.nnodes!r}") from None
    if not 0 < lo <= hi:
        raise ValueError(f"--nnodes: need 1 <= min <= max, got {lo}:{hi}")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts: must be >= 0, got {args.max_restarts}")
    if args.no_python and args.module and not args.run_path:
        raise ValueError("--no-python and --module cannot be used together (as in torchrun)")


def _given(argv: list[str], *flags: str) -> bool:
    return any(w in flags or w.split("=", 1)[0] in flags for w in argv)


def options_from_args(
    args: argparse.Namespace, argv: list[str], *, default_log_dir: str | None = None
) -> tuple[LaunchOptions, list[str]]:
    """The launch options and config overrides of a parsed ``rankguard run`` line
    (``argv``: the words, to tell a flag given from its default)."""
    from torch.distributed.run import config_from_args

    overrides, target, target_args = split_overrides(
        args.training_script, list(args.training_script_args)
    )
    args.training_script, args.training_script_args = target, target_args
    if args.run_id_alias:
        args.rdzv_id = args.run_id_alias
    rdzv_id = args.rdzv_id
    head = argv[: len(argv) - len(target_args) - 1]
    node_rank_given = "PET_NODE_RANK" in os.environ or _given(head, "--node-rank", "--node_rank")
    torch_log_dir = args.log_dir
    rank_prefix = bool(args.rank_prefix)
    if rank_prefix and args.tee == "0" and args.redirects == "0":
        args.tee = "3"  # the prefix is torch's, on tee'd lines
    if args.log_dir is None and default_log_dir is not None:
        args.log_dir = default_log_dir
    local = _torchrun_rule(args)
    if args.rdzv_join_timeout is not None:
        conf = dict(
            kv.split("=", 1) for kv in filter(None, str(args.rdzv_conf).split(",")) if "=" in kv
        )
        if "join_timeout" in conf and float(conf["join_timeout"]) != args.rdzv_join_timeout:
            raise ValueError(
                f"--rdzv-join-timeout {args.rdzv_join_timeout:g} and --rdzv-conf "
                f"join_timeout={conf['join_timeout']} disagree: give one of them"
            )
        if "join_timeout" not in conf:
            sep = "," if args.rdzv_conf else ""
            args.rdzv_conf = f"{args.rdzv_conf}{sep}join_timeout={args.rdzv_join_timeout:g}"
    _check_torch_values(args)
    notes: list[str] = []
    with _torch_warnings(notes):
        try:
            cfg, _cmd, _cmd_args = config_from_args(args)
        except (AssertionError, RuntimeError) as exc:
            raise ValueError(str(exc)) from None
        except ValueError as exc:
            if "nproc_per_node" in str(exc) or "available" in str(exc):
                raise ValueError(f"--nproc-per-node {args.nproc_per_node}: {exc}") from None
            raise
    entry = ENTRY_PYTHON
    if args.run_path:
        entry = ENTRY_RUN_PATH
    elif args.no_python:
        entry = ENTRY_NO_PYTHON
    conf = dict(cfg.rdzv_configs)
    if cfg.rdzv_backend == "c10d" and cfg.max_nodes == 1:
        # a c10d store on a free port of this machine: what torchrun's local rule makes
        local = local or str(cfg.rdzv_endpoint).rsplit(":", 1)[-1] == "0"
    endpoint = None if local else (cfg.rdzv_endpoint or None)
    node_rank: int | None = args.node_rank
    if cfg.rdzv_backend != "static" and not node_rank_given:
        node_rank = None if cfg.max_nodes > 1 else 0
    template = cfg.log_line_prefix_template
    if rank_prefix and not template:
        template = RANK_PREFIX_TEMPLATE
    if rank_prefix and args.tee == "0":
        notes.append(
            "--rank-prefix has NO effect with --redirects and no --tee: torch prefixes "
            "the lines it tees to the console, and the redirected ones never reach it"
        )
    elif rank_prefix and cfg.log_line_prefix_template:
        notes.append(
            "--rank-prefix: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is set and wins "
            f"({cfg.log_line_prefix_template!r})"
        )
    opts = LaunchOptions(
        target=target,
        target_args=target_args,
        module=bool(args.module),
        entry=entry,
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        nproc_per_node=cfg.nproc_per_node,
        node_rank=node_rank,
        rdzv_backend=cfg.rdzv_backend,
        rdzv_endpoint=endpoint,
        rdzv_id=None if rdzv_id in (None, "none") and local else rdzv_id,
        rdzv_conf=conf,
        rdzv_join_timeout_s=float(conf.get("join_timeout", 600.0)),
        max_restarts=cfg.max_restarts,
        monitor_interval_s=cfg.monitor_interval,
        start_method=cfg.start_method,
        role=cfg.role,
        local_addr=cfg.local_addr,
        standalone=local,
        live_status=bool(args.live),
        rank_prefix=rank_prefix,
        line_prefix_template=template,
        preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
        logs_specs=cfg.logs_specs,
        elastic=cfg,
        notes=tuple(notes),
        shutdown_timeout_s=_shutdown_timeout(args),
    )
    all_overrides = [*args.overrides, *overrides]
    if args.standby_ranks is not None:  # the flag wins over the config file's key
        if args.standby_ranks < 0:
            raise ValueError(f"--standby-ranks: must be >= 0, got {args.standby_ranks}")
        all_overrides.append(f"inprocess_restart.standby_ranks={args.standby_ranks}")
    if torch_log_dir:
        all_overrides.insert(0, f"log_dir={torch_log_dir}")
    return opts, all_overrides


def parse_run_args(
    argv: list[str], *, default_log_dir: str | None = None
) -> tuple[LaunchOptions, list[str]]:
    """``rankguard run ARGV`` -> launch options and config overrides (imports torch).
    A bad line exits 2 with argparse's message; a bad value is a ValueError."""
    args = build_run_parser().parse_args(argv)
    return options_from_args(args, argv, default_log_dir=default_log_dir)
