"""``rankguard run``: torch.distributed.elastic's agent plus rankguard's side services.

Built from the public pieces of torch elastic, as torchrun is, but holding the c10d
rendezvous store itself: node 0's launcher hosts it, so it outlives the workers and can
carry the heartbeat relay of the other nodes until node 0's monitor has drained them.

Flow on every node: config -> run directory -> rendezvous store -> side services
(:mod:`.services`) -> ``LocalElasticAgent.run()`` -> stop services -> summary. Workers
are started as ``python -m rankguard.launcher.worker SCRIPT ARGS`` with the run's
identity in ``RANKGUARD_*`` environment variables.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from rankguard._fs import atomic_write_json
from rankguard.config import RankguardConfig, config_to_dict, dumps_config
from rankguard.heartbeat.identity import ENV
from rankguard.launcher.agent import RankguardAgent, first_failure
from rankguard.launcher.console import LiveStatus
from rankguard.launcher.exitcodes import (
    EXIT_CRASH,
    EXIT_FAILED,
    EXIT_HANG,
    EXIT_NO_RESTART,
    EXIT_OK,
    EXIT_STRAGGLER,
    EXIT_USAGE,
)
from rankguard.launcher.options import LaunchOptions
from rankguard.launcher.services import NodeServices
from rankguard.schema.findings import FindingType
from rankguard.schema.layout import FINDINGS_FILE, STATUS_FILE

__all__ = ["launch", "run_dir_for"]

logger = logging.getLogger("rankguard.launcher")


def run_dir_for(cfg: RankguardConfig, run_id: str) -> Path:
    return Path(cfg.log_dir).resolve() / "heartbeat" / run_id


def _rendezvous(opts: LaunchOptions, run_id: str) -> tuple[Any, Any, str, int]:
    """The c10d rendezvous handler and the store it uses (hosted here on node 0)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    endpoint = "127.0.0.1:0" if opts.standalone else str(opts.rdzv_endpoint)
    params = RendezvousParameters(
        backend="c10d",
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=opts.min_nodes,
        max_nodes=opts.max_nodes,
        is_host=opts.standalone or opts.node_rank == 0,
    )
    backend, store = create_backend(params)
    handler = DynamicRendezvousHandler.from_backend(
        run_id=run_id,
        store=store,
        backend=backend,
        min_nodes=opts.min_nodes,
        max_nodes=opts.max_nodes,
        timeout=RendezvousTimeout(join=timedelta(seconds=opts.rdzv_join_timeout_s)),
    )
    host = endpoint.rsplit(":", 1)[0]
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
        from rankguard.launcher.rendezvous import FreshStoreRendezvous

        handler = FreshStoreRendezvous(handler)
    return handler, store, host, int(store.port)  # type: ignore[attr-defined]


def _store_client(host: str, port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))


def _worker_env(cfg: RankguardConfig, run_id: str, run_dir: Path, node_rank: int) -> None:
    os.environ[ENV.RUN_ID] = run_id
    os.environ[ENV.RUN_DIR] = str(run_dir)
    os.environ[ENV.NODE_RANK] = str(node_rank)
    os.environ[ENV.CONFIG] = dumps_config(cfg)
    os.environ[ENV.LAUNCHER] = "1"
    os.environ[ENV.LOG_DIR] = str(Path(cfg.log_dir).resolve())
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


def _fresh_worker_store() -> None:
    # With the c10d rendezvous, torch elastic by default lets the workers' process group
    # share one TCPStore, unprefixed, across restarts (it assumes a new store per retry).
    # The keys of the previous attempt stay there, and a restarted gloo group reads a dead
    # peer's address ("Connection refused" in connectFullMesh): the in-job restart fails.
    # Torch's public switch gives each rendezvous round a fresh store on a free port;
    # ``FreshStoreRendezvous`` then hosts it in the agent (see there).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def _thread_defaults(opts: LaunchOptions) -> None:
    # As torchrun does: several ranks per node each using every core oversubscribe the
    # CPU badly; one intra-op thread per rank unless the user chose otherwise.
    if opts.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        _say("OMP_NUM_THREADS=1 for each rank (set it yourself to choose another value)")


def start_fork_server(modules: tuple[str, ...]) -> None:
    """``--preload``: start the fork server that imports ``modules`` once; every rank is
    then forked from it, at the first start and at each restart, instead of starting a
    new interpreter and importing torch again (about a second per restart here).

    Python's fork server skips a preload module it cannot import without a word, so each
    one is looked up first: a missing module is an error, not a silent slow start. The
    server is started now so that its imports overlap the launcher's own set-up; it
    inherits the launcher's environment as it is at this point (the rankguard variables
    and OMP_NUM_THREADS are already set)."""
    import importlib.util
    import multiprocessing
    import multiprocessing.forkserver

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"--preload: no module named {name!r}")
    # "__main__" first, as Python's own default: the forked ranks then do not re-run the
    # launcher's main module.
    multiprocessing.set_forkserver_preload(
        ["__main__", "rankguard.launcher.worker", *dict.fromkeys(modules)]
    )
    multiprocessing.forkserver.ensure_running()
    _say(
        f"--preload {','.join(modules)}: ranks are forked from a fork server that imported "
        "them once (at start and at every restart)"
    )


def _timeouts_in_force(cfg: RankguardConfig) -> dict[str, Any] | None:
    """Apply learned timeouts (``calc_ft_timeouts``); each timeout and its source."""
    from rankguard.ft.learned import STATE_FILE, apply_learned, load_state
    from rankguard.launcher.services import ft_state_path

    state, source = None, "config"
    if cfg.fault_tolerance.calc_ft_timeouts:
        path = ft_state_path(cfg) / STATE_FILE
        try:
            state = load_state(path)
        except ValueError as exc:
            _say(f"calc_ft_timeouts: {exc}: fix or delete it")
            return None
        if state is None:
            _say(f"calc_ft_timeouts: no {path} yet: configured timeouts now, learned at the end")
        else:
            source = f"learned ({path}, {state.get('runs')} run(s))"
            _say(f"calc_ft_timeouts: using {source}: {state['timeouts']}")
    return apply_learned(cfg, state, source)


def _say(msg: str) -> None:
    print(f"[rankguard] {msg}", file=sys.stderr, flush=True)


def launch(opts: LaunchOptions, cfg: RankguardConfig) -> int:
    """Run the job on this node; return the process exit code."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    run_id = opts.run_id()
    run_dir = run_dir_for(cfg, run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    hb = cfg.heartbeat
    if not hb.enabled and hb.hardware_health.enabled:
        _say(
            "heartbeat.hardware_health.enabled=true has NO effect while "
            "heartbeat.enabled=false: set heartbeat.enabled=true"
        )
    if not hb.enabled:
        _say(
            "heartbeat monitoring is OFF (heartbeat.enabled=false): no liveness, progress "
            "or hang detection for this run"
        )
    if cfg.perf.prometheus.enabled and opts.node_rank == 0:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            _say(
                "perf.prometheus.enabled=true needs prometheus-client: "
                "pip install 'rankguard[prometheus]'"
            )
            return 2
    if cfg.enable_gpu_health_check:
        from rankguard.launcher.preflight import preflight_gpu_check

        refused = preflight_gpu_check(
            command_timeout_s=hb.hardware_health.command_timeout_s,
            node_rank=opts.node_rank,
            run_dir=run_dir,
            say=_say,
        )
        if refused is not None:
            return refused
    timeouts = _timeouts_in_force(cfg)
    if timeouts is None:
        return EXIT_USAGE
    _worker_env(cfg, run_id, run_dir, opts.node_rank)
    _thread_defaults(opts)
    _fresh_worker_store()
    if opts.preload:
        try:
            start_fork_server(opts.preload)
        except ValueError as exc:
            _say(str(exc))
            return EXIT_USAGE

    ft = cfg.fault_tolerance
    max_restarts = opts.max_restarts
    if ft.num_in_job_restarts:
        if opts.max_restarts and opts.max_restarts != ft.num_in_job_restarts:
            _say(
                f"--max-restarts {opts.max_restarts} and fault_tolerance.num_in_job_restarts="
                f"{ft.num_in_job_restarts} disagree: give one of them"
            )
            return EXIT_USAGE
        max_restarts = ft.num_in_job_restarts
    if ft.enable_ft_package and not hb.enabled:
        _say(
            "fault_tolerance.enable_ft_package=true but heartbeat.enabled=false: hangs are NOT "
            "detected and will NOT be restarted; only crashes restart. Set heartbeat.enabled=true"
        )
    if max_restarts and not ft.enable_ft_package and hb.enabled:
        _say(
            f"{max_restarts} in-job restart(s) for crashes only: hangs found by the monitor "
            "are reported, not restarted (set fault_tolerance.enable_ft_package=true)"
        )
    handler, store, host, port = _rendezvous(opts, run_id)
    client = _store_client(host, port) if opts.multi_node else None
    services = NodeServices(
        cfg=cfg,
        run_dir=run_dir,
        run_id=run_id,
        node_rank=opts.node_rank,
        nnodes=opts.max_nodes,
        expected_world_size=opts.expected_world_size,
        store=client,
        timeouts=timeouts,
    )
    if opts.multi_node and hb.enabled and not cfg.no_shared_fs and opts.node_rank != 0:
        _say(
            "no_shared_fs=false: this node's heartbeats are NOT relayed; node 0 sees them "
            "only if log_dir is on a filesystem shared with it"
        )
    worker_args = ["-m"] if opts.module else []
    worker_args += [opts.target, *opts.target_args]
    entrypoint: Any = sys.executable
    entry_args = ["-u", "-m", "rankguard.launcher.worker", *worker_args]
    start_method = "spawn"  # unused: a command entry point starts as a subprocess
    if opts.preload:  # torch elastic's function entry point, forked by the fork server
        from rankguard.launcher.worker import forked_main

        entrypoint, entry_args, start_method = forked_main, worker_args, "forkserver"
    spec = WorkerSpec(
        role="trainer",
        local_world_size=opts.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(entry_args),
        rdzv_handler=handler,
        max_restarts=max_restarts,
        monitor_interval=opts.monitor_interval_s,
    )
    logs = DefaultLogsSpecs(log_dir=str(Path(cfg.log_dir).resolve() / "elastic"))
    agent = RankguardAgent(
        spec=spec,
        logs_specs=logs,
        start_method=start_method,
        on_signal=services.note_shutdown,
        on_restart=services.on_restart,
        grace_s=ft.termination_grace_s,
    )
    atomic_write_json(
        run_dir / f"launcher_node_{opts.node_rank}.json",
        {
            "run_id": run_id,
            "node_rank": opts.node_rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "target": opts.target,
            "target_args": opts.target_args,
            "nproc_per_node": opts.nproc_per_node,
            "nnodes": [opts.min_nodes, opts.max_nodes],
            "rendezvous": f"{host}:{port}",
            "config": config_to_dict(cfg),
        },
    )
    _say(
        f"run {run_id}: {opts.nproc_per_node} rank(s) on node {opts.node_rank}, files in {run_dir}"
    )
    services.start()
    services.attach_agent(agent)
    live = LiveStatus(services.monitor) if opts.live_status and services.monitor else None
    if live is not None:
        live.start()
    from torch.distributed.elastic.multiprocessing.api import SignalException

    result = None
    stopped_by: int | None = None
    try:
        result = agent.run()
    except SignalException as exc:
        stopped_by = int(exc.sigval)
    finally:
        if live is not None:
            live.stop()
        status = services.stop()
        if services.monitor is not None:
            _report(run_dir, status)
        try:
            handler.shutdown()
        except Exception as exc:
            logger.debug("rendezvous shutdown: %s", exc)
        del store  # node 0 hosted it: it had to outlive the drain above
    if stopped_by is not None:
        _say(f"stopped by signal {stopped_by}: the workers were terminated")
        return 128 + stopped_by
    if result is None or result.is_failed():
        root = first_failure(result) or agent.last_failure
        cause = agent.pending_cause or root
        if root is not None:
            _say(
                f"root cause: rank {root['rank']} (pid {root['pid']}) exited with code "
                f"{root['exit_code']}{' (' + root['signal'] + ')' if root['signal'] else ''}"
                f": {(root['error'] or '-').strip().splitlines()[-1][:300]}"
            )
        if agent.restarts:
            _say(f"{agent.restarts} in-job restart(s) spent (budget {max_restarts})")
        if not ft.enable_ft_package:
            return EXIT_FAILED
        if agent.aborted:
            return EXIT_NO_RESTART
        ftype = FindingType.parse(cause.get("finding_type")) if cause is not None else None
        if ftype is not None and ftype.info.hang:
            return EXIT_HANG
        return EXIT_CRASH
    if services.stop_at is not None:
        _say(f"every rank stopped at step {services.stop_at} (stop_if_detected)")
        return EXIT_STRAGGLER
    return EXIT_OK


def _report(run_dir: Path, status: dict[str, Any] | None) -> None:
    status = status or {}
    summary = status.get("summary") or {}
    _say(f"monitor: state {status.get('state')}, {summary.get('findings_total', 0)} finding(s)")
    for finding in status.get("recent_findings") or []:
        _say(f"  finding: {finding.get('message')}")
    _say(f"status:   {run_dir / STATUS_FILE}")
    _say(f"findings: {run_dir / FINDINGS_FILE}")
    _say(f"see: rankguard status {run_dir}")
    _say(f"     rankguard report {run_dir}")
