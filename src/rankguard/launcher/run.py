"""``rankguard run``: torch.distributed.elastic's agent plus rankguard's side services.

Built from the public pieces of torch elastic, as torchrun is, but holding the c10d
rendezvous store itself: node 0's launcher hosts it, so it outlives the workers and can
carry the heartbeat relay of the other nodes until node 0's monitor has drained them.

Flow on every node (:func:`launch`): config checks (:mod:`.checks`) -> rendezvous store
-> run directory (:mod:`.rundir`: created 0750, refused if another user's) -> workers'
environment -> side services (:mod:`.services`) -> ``LocalElasticAgent.run()`` ->
stop services -> summary and exit code (:mod:`.exitcodes`). Workers are started as
``python -m rankguard.launcher.worker SCRIPT ARGS`` with the run's identity in
``RANKGUARD_*`` environment variables.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rankguard.config import RankguardConfig, config_to_dict, dumps_config
from rankguard.ft.failure import WorkerFailure
from rankguard.ft.flightrec import flight_recorder_env
from rankguard.launcher.agent import RankguardAgent, first_failure
from rankguard.launcher.checks import check_launch
from rankguard.launcher.console import LiveStatus, run_end_line
from rankguard.launcher.elastic import build_agent, features_line
from rankguard.launcher.exitcodes import (
    EXIT_NODE_EXCLUDED,
    EXIT_RERUN_RESUME,
    EXIT_RERUN_VALIDATION_FAILED,
    EXIT_USAGE,
    JobOutcome,
    exit_code,
)
from rankguard.launcher.features import launch_services
from rankguard.launcher.forkserver import start_fork_server
from rankguard.launcher.forkwait import ForkWait
from rankguard.launcher.node import node_identity
from rankguard.launcher.nodeservice import LaunchContext, NodeLeft, NodeService
from rankguard.launcher.options import LaunchOptions
from rankguard.launcher.rendezvous import RoundWatcher
from rankguard.launcher.rundir import (
    DEFAULT_RUN_ID,
    ForeignDirectoryError,
    agreed_name,
    launch_name,
    link_latest,
    prepare_run_dir,
)
from rankguard.launcher.services import NodeServices, node_cadence
from rankguard.launcher.verdict import failure_summary, root_cause_lines
from rankguard.live.roles import STANDBY_RANKS_ENV
from rankguard.rank.identity import ENV
from rankguard.schema import layout
from rankguard.schema.cadence import Cadence
from rankguard.schema.coerce import as_dict, as_list, as_str
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.status import StatusDoc
from rankguard.schema.statusblocks import GoodputBlock
from rankguard.util.fs import atomic_write_json
from rankguard.util.gcfreeze import freeze_startup
from rankguard.util.procs import process_started_unix_s
from rankguard.util.textsafe import safe_text

__all__ = ["job_name", "launch", "run_dir_for"]

logger = logging.getLogger("rankguard.launcher")


def run_dir_for(cfg: RankguardConfig, run_id: str) -> Path:
    return layout.run_dir(cfg.log_dir, run_id)


def _run_dir_name(opts: LaunchOptions, cfg: RankguardConfig, run_id: str, store: Any) -> str:
    """The run directory's name: the run id, or, for torchrun's default id on several
    nodes, one of this launch's own (:func:`~rankguard.launcher.rundir.launch_name`),
    agreed through the rendezvous store when the launcher holds one. Without a store
    and with ``no_shared_fs=false`` the nodes must share one directory: ``none``, said."""
    if not opts.default_run_id:
        return run_id
    if store is not None:
        return agreed_name(store, layout.StoreKeys(run_id).run_dir_name, launch_name(run_id))
    if cfg.no_shared_fs:
        return launch_name(run_id)  # node-local files: each node names its own
    _say(
        f"run id {DEFAULT_RUN_ID} (torchrun's default) with --rdzv-backend "
        f"{opts.rdzv_backend} and no_shared_fs=false: every launch shares "
        f"heartbeat/{DEFAULT_RUN_ID}; give --rdzv-id to keep runs apart"
    )
    return run_id


def _rendezvous(opts: LaunchOptions, run_id: str) -> tuple[Any, Any, str, int, bool]:
    """The rendezvous handler, the store rankguard's relays use (None: the handler's
    own, taken at the first round), its host and port, and whether this agent hosts it.

    c10d (and torchrun's local rendezvous): the store is held here, hosted by the node
    whose ``--rdzv-endpoint`` host is this machine, as torch elastic decides
    (:func:`rendezvous_store`), or node 0 when ``--node-rank`` is given.
    ``--standalone``: every store of the job listens on 127.0.0.1 only (the rendezvous
    store here, each round's worker store in :class:`FreshStoreRendezvous`) and the
    workers are told 127.0.0.1 as ``MASTER_ADDR``. Any other backend (``static``,
    ``etcd``, ``etcd-v2``, a registered plugin) is torch's own handler
    (:func:`registry_rendezvous`)."""
    if opts.rdzv_backend != "c10d":
        from rankguard.launcher.backends import registry_rendezvous

        handler, host, port = registry_rendezvous(opts, run_id)
        return handler, None, host, port, False
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
    )
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from rankguard.launcher.backends import rendezvous_timeout
    from rankguard.launcher.rendezvous import (
        LOOPBACK,
        keep_alive_settings,
        loopback_store_server,
        rendezvous_store,
    )

    hosting = True
    if opts.standalone:
        # torch's create_backend would bind its store to every interface.
        store: Any = loopback_store_server(0, timeout_s=60.0, multi_tenant=True)
        endpoint = f"{LOOPBACK}:{store.port}"
    else:
        endpoint = str(opts.rdzv_endpoint)
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
        given = None if opts.node_rank is None else opts.node_rank == 0
        if given is None and opts.max_nodes == 1:
            given = True  # no other agent to share the port with: a busy port is an error
        if "is_host" in opts.rdzv_conf:  # torch's c10d conf key wins
            given = str(opts.rdzv_conf["is_host"]).lower() in ("1", "true", "yes")
        store, hosting = rendezvous_store(host, port, given)
    backend: Any = C10dRendezvousBackend(store, run_id)
    handler = DynamicRendezvousHandler.from_backend(
        run_id=run_id,
        store=store,
        backend=backend,
        min_nodes=opts.min_nodes,
        max_nodes=opts.max_nodes,
        local_addr=LOOPBACK if opts.standalone else opts.local_addr,
        timeout=rendezvous_timeout(opts.rdzv_conf, opts.rdzv_join_timeout_s),
        **keep_alive_settings(opts.rdzv_conf),
    )
    host = endpoint.rsplit(":", 1)[0]
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
        from rankguard.launcher.rendezvous import FreshStoreRendezvous

        handler = FreshStoreRendezvous(handler, loopback=opts.standalone)
    return handler, store, host, int(store.port), hosting


def _store_client(host: str, port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))


def job_name(opts: LaunchOptions) -> str:
    """The training job a run belongs to (perf retention keeps the newest runs of one
    job): its module, or its script's absolute path."""
    return opts.target if opts.module else str(Path(opts.target).resolve())


def _worker_env(cfg: RankguardConfig, run_id: str, run_dir: Path, job: str | None = None) -> None:
    os.environ.update(cfg.envs)  # as FlagScale exports experiment.envs before its launch
    os.environ[ENV.RUN_ID] = run_id
    if job is not None:
        os.environ[ENV.JOB] = job
    os.environ[ENV.RUN_DIR] = str(run_dir)
    # The ranks take their node from torch elastic's GROUP_RANK (the rendezvous' number,
    # which is rankguard's too): no stale value from an outer environment.
    os.environ.pop(ENV.NODE_RANK, None)
    os.environ[ENV.CONFIG] = dumps_config(cfg)
    os.environ[ENV.LAUNCHER] = "1"
    os.environ[ENV.LOG_DIR] = str(Path(cfg.log_dir).resolve())
    os.environ[ENV.LAUNCHER_PID] = str(os.getpid())
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # PyTorch's flight recorder: each rank's recent collectives, dumped on a hang
    os.environ.update(flight_recorder_env(run_dir, os.environ))
    ip = cfg.inprocess_restart
    if ip.standby_ranks:  # the bootstrap gives the script the training world's numbers
        os.environ[STANDBY_RANKS_ENV] = str(ip.standby_ranks)
    else:
        os.environ.pop(STANDBY_RANKS_ENV, None)


def _loopback_gloo() -> None:
    # --standalone: the workers' gloo listeners on the loopback interface too (gloo
    # otherwise binds the address the hostname resolves to), unless the user chose one.
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return
    if "lo" in names:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"


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


def _timeouts_in_force(cfg: RankguardConfig) -> tuple[RankguardConfig, Cadence] | None:
    """The configuration with the learned timeouts in (``calc_ft_timeouts``), and the
    job's cadence: each timeout in force and its source; None (said why) when the
    learned state cannot be read."""
    from rankguard.ft.learned import learned_config, load_state
    from rankguard.ft.nvrx_state import RANKGUARD_STATE_FILE

    ft = cfg.fault_tolerance
    state, source = None, "config"
    if ft.calc_ft_timeouts:
        path = layout.ft_state_dir(cfg.log_dir, ft.state_dir) / layout.FT_STATE_FILE
        try:
            state = load_state(path)
        except ValueError as exc:
            _say(f"calc_ft_timeouts: {exc}: fix or delete it")
            return None
        if state is None:
            _say(
                f"calc_ft_timeouts: no learned timeouts in {path.parent} yet: configured "
                "timeouts now, learned at the end"
            )
        else:
            own = path.parent / RANKGUARD_STATE_FILE  # rankguard's own file, else NVRx's
            source = f"learned ({own if own.exists() else path}, {state.get('runs')} run(s))"
            _say(f"calc_ft_timeouts: using {source}: {state['timeouts']}")
    cfg, sources = learned_config(cfg, state, source)
    return cfg, node_cadence(cfg, sources)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _say(msg: str) -> None:
    """One launcher line on stderr. What it quotes (finding messages, a rank's error,
    hostnames, paths) is shown with its control characters escaped."""
    print(f"[rankguard] {safe_text(msg)}", file=sys.stderr, flush=True)


def launch(opts: LaunchOptions, cfg: RankguardConfig) -> int:
    """Run the job on this node; return the process exit code (in the table of the
    scheduler ``exit_codes`` names: :mod:`rankguard.scheduler`)."""
    from rankguard.scheduler import for_exit_codes

    return for_exit_codes(cfg.exit_codes).exit_code(_launch(opts, cfg))


def _launch(opts: LaunchOptions, cfg: RankguardConfig) -> int:
    freeze_startup()  # torch's module state, imported: the agent's collections skip it
    _say(features_line(opts, cfg))
    for note in opts.notes:
        _say(note)
    run_id = opts.run_id()
    launch = LaunchContext(opts=opts, cfg=cfg, run_id=run_id, say=_say)
    features = launch_services(cfg)  # every feature's service, null when it is off
    max_restarts = _check(opts, cfg, features, launch)
    if max_restarts is None:
        return EXIT_USAGE
    timed = _timeouts_in_force(cfg)
    if timed is None:
        return EXIT_USAGE
    cfg, cadence = timed  # the learned timeouts are in the one every part reads
    launch.cfg = cfg
    # The rendezvous first: a default run id's directory name is agreed through its
    # store, and nothing is created before it holds its port (a busy one leaves no
    # empty run directory behind).
    _fresh_worker_store()  # read by _rendezvous
    try:
        handler, store, host, port, hosting = _rendezvous(opts, run_id)
    except (RuntimeError, ValueError) as exc:
        _say(f"rendezvous: {_one_line(exc)}")
        return EXIT_USAGE
    try:
        run_dir = run_dir_for(cfg, _run_dir_name(opts, cfg, run_id, store))
        prepare_run_dir(Path(cfg.log_dir), run_dir, cfg.dir_mode(), first=hosting)
    except (ForeignDirectoryError, NotADirectoryError, ValueError) as exc:
        _say(_one_line(exc))
        return EXIT_USAGE
    except OSError as exc:
        _say(f"log_dir {cfg.log_dir}: cannot create {exc.filename or cfg.log_dir}: {exc.strerror}")
        return EXIT_USAGE
    except RuntimeError as exc:  # the rendezvous store did not answer
        _say(f"rendezvous: {_one_line(exc)}")
        return EXIT_USAGE
    if run_dir.name != run_id:
        link_latest(run_dir.parent, run_dir.name)
    launch.run_dir, launch.hosting = run_dir, hosting
    if opts.multi_node and store is not None:  # the features' own clients of the store
        launch.store_client = lambda: _store_client(host, port)
    for feature in features:
        refused = feature.preflight(launch)
        if refused is not None:
            return refused
    _environment(opts, cfg, run_id, run_dir, features)
    fork_started = time.monotonic()
    try:  # --preload: the environment its ranks are forked with
        fork_env = start_fork_server(opts.preload) if opts.preload else None
    except ValueError as exc:
        _say(str(exc))
        return EXIT_USAGE
    services = _services(
        opts, cfg, run_id, run_dir, cadence, host, port, store is not None, features
    )
    fork_wait = (  # --preload with heartbeats: the ranks' fork told to the monitor
        ForkWait(
            opts.preload,
            fork_started,
            cadence.initial_process_timeout_s,
            _say,
            lambda: services.monitor,
        )
        if fork_env is not None and cfg.heartbeat.enabled
        else None
    )
    launch.services = services
    node = NodeStart(opts, cfg, run_id, run_dir, f"{host}:{port}", services)
    for feature in features:  # hot spares, bad-node exclusion
        handler = feature.wrap_rendezvous(handler, launch)
    agent = build_agent(
        opts,
        cfg,
        RoundWatcher(handler, node.on_round),
        services,
        max_restarts,
        run_dir,
        fork_env=fork_env,
        fork_wait=fork_wait,
    )
    node.agent = agent
    for feature in features:
        feature.attach(agent, launch)
    services.workers = agent.workers  # fault tolerance signals these processes only
    services.agent = agent
    left: NodeLeft | None = None
    result: Any = None
    stopped_by: int | None = None
    try:
        try:
            result, stopped_by = _run_agent(agent, node)
        except NodeLeft as exc:  # a feature took this node out of the job
            result, stopped_by, left = None, None, exc
            if exc.renumbered:  # its node number may be another's now
                services.leave()
            for feature in features:
                feature.left(exc, handler, launch)
    finally:
        for feature in features:
            feature.closing(launch)
        _stop(services, handler, run_dir, _launch_end(result, stopped_by, agent, services))
        if hosting and (
            services.node_rank not in (None, 0)
            or any(feature.keeps_store(left) for feature in features)
        ):
            _keep_store_for_monitor(services)
        if hosting:
            for feature in features:
                feature.release_store(launch)
        del store  # hosted here: it had to outlive node 0's drain
    if left is not None:
        _say(f"{left}: exit {EXIT_NODE_EXCLUDED} (retry without the excluded host(s))")
        return exit_code(JobOutcome(excluded=True, fault_tolerance=True))
    if result is None and stopped_by is None and _left_waiting(handler):
        _say("the job ended while this agent waited as a spare: it was not needed")
        return 0
    outcome = _outcome(result, stopped_by, agent, services, cfg, max_restarts, opts.target)
    return exit_code(services.outcome(outcome))


def _left_waiting(handler: Any) -> bool:
    """The job ended while this agent waited as a hot spare: its ``SpareKeeper``, found
    through the wrappers around it (bad-node exclusion's), says so."""
    while handler is not None:
        if getattr(handler, "left_waiting", False):
            return True
        handler = getattr(handler, "inner", None)
    return False


class NodeStart:
    """Called by the rendezvous after each round (:class:`RoundWatcher`): the first one
    tells this node's rank (:mod:`.node`); the node's services start then, before its
    workers do."""

    def __init__(
        self,
        opts: LaunchOptions,
        cfg: RankguardConfig,
        run_id: str,
        run_dir: Path,
        rendezvous: str,
        services: NodeServices,
    ) -> None:
        self.opts, self.cfg, self.run_id, self.run_dir = opts, cfg, run_id, run_dir
        self.rendezvous = rendezvous
        self.services = services
        self.agent: RankguardAgent | None = None
        self.live: LiveStatus | None = None

    def on_round(self, info: Any) -> None:
        from rankguard.launcher.rendezvous import round_tag

        decided = node_identity(self.opts.node_rank, int(info.rank), self.services.node_rank)
        if decided.warning:
            _say(decided.warning)
        self.services.round_tag = round_tag(info)
        before = self.services.round_nodes
        self.services.note_round(int(info.world_size))
        if self.services.node_rank is not None and info.world_size < self.opts.max_nodes:
            _say(
                f"this round has {info.world_size} of {self.opts.max_nodes} node(s) "
                f"(--nnodes {self.opts.min_nodes}:{self.opts.max_nodes}): the job goes on "
                f"with {info.world_size * self.opts.nproc_per_node} rank(s)"
            )
        elif before is not None and before < info.world_size:
            _say(
                f"this round has {info.world_size} of {self.opts.max_nodes} node(s) again "
                f"(it had {before}): the job grows back to "
                f"{info.world_size * self.opts.nproc_per_node} rank(s)"
            )
        if decided.moved:
            if self.live is not None:
                self.live.stop()
                self.live = None
            self.services.move(decided.node_rank)
            _write_launcher_file(
                self.opts, self.cfg, self.run_id, self.run_dir, self.rendezvous, decided.node_rank
            )
            if self.agent is not None:
                self.services.attach_agent(self.agent)
            if self.opts.live_status and self.services.monitor is not None:
                self.live = LiveStatus(self.services.monitor)
                self.live.start()
            return
        if not decided.first:
            self.services.regrouped()
            return
        node = self.services.node_rank = decided.node_rank
        if self.services.store is None and self.opts.multi_node:
            # a backend other than c10d: the relays use the store its handler hands out
            self.services.store = getattr(info, "store", None)
        _write_launcher_file(self.opts, self.cfg, self.run_id, self.run_dir, self.rendezvous, node)
        _say(
            f"run {self.run_id}: {self.opts.nproc_per_node} rank(s) on node {node}"
            f"{'' if self.opts.node_rank is not None else ' (numbered by the rendezvous)'}, "
            f"files in {self.run_dir}"
        )
        self.services.start()  # each feature's service too (.features)
        if self.agent is not None:
            self.services.attach_agent(self.agent)
        if self.opts.live_status and self.services.monitor is not None:
            self.live = LiveStatus(self.services.monitor)
            self.live.start()


def _keep_store_for_monitor(services: NodeServices) -> None:
    """This node hosts the rendezvous store, node 0 runs the monitor: the store stays
    until node 0's monitor has drained every relay (bounded). A host that never had a
    number in any round, in a job whose node 0 never started its monitor (the job ended
    before its first round: the rendezvous closed below ``--nnodes`` MIN), has nobody to
    wait for."""
    if services.node_rank is None and not services.monitor_ever_started():
        return
    wait_s = 60.0
    _say(f"keeping the rendezvous store up to {wait_s:.0f} s for node 0's monitor")
    if not services.wait_for_monitor(wait_s):
        _say("node 0's monitor did not say it finished; the rendezvous store goes now")


def _check(
    opts: LaunchOptions, cfg: RankguardConfig, features: list[NodeService], launch: LaunchContext
) -> int | None:
    """Print the configuration's warnings; the in-job restart budget in force, or None
    (said why) when the command line and the configuration (or a feature's service:
    a package it needs) cannot run together."""
    for warning in cfg.warnings():
        _say(warning)
    for feature in features:
        problem = feature.check(launch)
        if problem is not None:
            _say(problem)
            return None
    try:
        checked = check_launch(opts, cfg)
    except ValueError as exc:
        _say(str(exc))
        return None
    for warning in checked.warnings:
        _say(warning)
    return checked.max_restarts


def _environment(
    opts: LaunchOptions,
    cfg: RankguardConfig,
    run_id: str,
    run_dir: Path,
    features: list[NodeService],
) -> None:
    """The environment the workers inherit (and ``--preload``'s fork server, started
    next), the features' part included."""
    _worker_env(cfg, run_id, run_dir, job_name(opts))
    for feature in features:  # e.g. NVRx's NCCL settings for in-process restarts
        feature.environment(os.environ)
    os.environ[ENV.MAX_WORLD_SIZE] = str(opts.max_nodes * opts.nproc_per_node)
    _thread_defaults(opts)
    if opts.standalone:
        _loopback_gloo()


def _services(
    opts: LaunchOptions,
    cfg: RankguardConfig,
    run_id: str,
    run_dir: Path,
    cadence: Cadence,
    host: str,
    port: int,
    held_store: bool = True,
    features: list[NodeService] | None = None,
) -> NodeServices:
    return NodeServices(
        cfg=cfg,
        run_dir=run_dir,
        run_id=run_id,
        node_rank=None,  # told by the first rendezvous round (NodeStart)
        nnodes=opts.max_nodes,
        expected_world_size=opts.expected_world_size,
        max_world_size=opts.max_nodes * opts.nproc_per_node,
        store=_store_client(host, port) if opts.multi_node and held_store else None,
        cadence=cadence,
        say=_say,
        features=features,
    )


def _started_unix_s() -> float | None:
    started = process_started_unix_s(os.getpid())
    return None if started is None else round(started, 3)


def _write_launcher_file(
    opts: LaunchOptions,
    cfg: RankguardConfig,
    run_id: str,
    run_dir: Path,
    rendezvous: str,
    node_rank: int,
) -> None:
    atomic_write_json(
        layout.RunLayout(run_dir).launcher(node_rank),
        {
            "run_id": run_id,
            "node_rank": node_rank,
            "node_rank_given": opts.node_rank,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            # the launch: the goodput ledger's wall time starts here (the launcher's own
            # start, the rendezvous and the first ranks' imports are start-up)
            "started_unix_s": _started_unix_s(),
            "target": opts.target,
            "target_args": opts.target_args,
            "nproc_per_node": opts.nproc_per_node,
            "nnodes": [opts.min_nodes, opts.max_nodes],
            "rdzv_backend": opts.rdzv_backend,
            "role": opts.role,
            "entry": opts.entry,
            "rendezvous": rendezvous,
            "config": config_to_dict(cfg),
        },
    )


def _run_agent(agent: RankguardAgent, node: NodeStart) -> tuple[Any, int | None]:
    """Run the workers to the end: torch elastic's result, or the signal that stopped
    the launcher."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        return agent.run(), None
    except SignalException as exc:
        return None, int(exc.sigval)
    finally:
        if node.live is not None:
            node.live.stop()


def _mark_launch_end(run_dir: Path) -> None:
    """Node 0's launcher file gains ``ended_unix_s``: now, the agent's run over (its
    workers gone, which the goodput ledger's wall time includes: a rank's interpreter
    exits seconds after its last record on a loaded machine). Only the file this
    process wrote (a job retry's launcher may have rewritten it)."""
    path = layout.RunLayout(run_dir).launcher(0)
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(obj, dict) or obj.get("pid") != os.getpid():
        return
    obj["ended_unix_s"] = round(time.time(), 3)
    try:
        atomic_write_json(path, obj)
    except OSError as exc:
        logger.warning("rankguard: %s: the launch's end not recorded: %s", path, exc)


def _launch_end(
    result: Any, stopped_by: int | None, agent: Any, services: NodeServices
) -> str | None:
    """:func:`_end_word` of this launch: was it preempted, did node 0 agree on a stop
    step (:attr:`NodeServices.stop_at`)."""
    pre = agent.preemption
    return _end_word(
        result, stopped_by, pre is not None and pre.active, services.stop_at is not None
    )


def _end_word(
    result: Any, stopped_by: int | None, preempted: bool = False, agreed_stop: bool = False
) -> str | None:
    """How the agent's run ended, for the final status (None: it did not say). A
    preempted job was stopped, although every rank left cleanly at the stop step; so
    was one whose ranks all left at a stop step node 0 agreed on (``agreed_stop``: a
    straggler with ``stop_if_detected``): its training did not reach its end."""
    if stopped_by is not None or preempted:
        return "stopped"
    if result is None:
        return None
    if result.is_failed():
        return "failed"
    return "stopped" if agreed_stop else "completed"


def _stop(services: NodeServices, handler: Any, run_dir: Path, end: str | None) -> None:
    """Stop the node's services; the run is over (``end``: how the agent's run ended,
    for the final status; None: it did not say)."""
    if services.node_rank == 0:  # before the final status: its goodput ledger ends here
        _mark_launch_end(run_dir)
    if services.monitor is not None:
        services.monitor.note_end(end)
    status = services.stop()
    if services.node_rank == 0:  # rank 0's perf files: a stopped rank 0 left them unclosed
        from rankguard.perf.finish import add_ettr, complete_summary

        perf_dir = layout.perf_dir(run_dir.parent.parent, run_dir.name)
        complete_summary(perf_dir)
        goodput = StatusDoc.from_dict(status).block(GoodputBlock)
        if goodput is not None:  # the same ETTR as the final status
            add_ettr(perf_dir, goodput.ettr)
    if services.monitor is not None:
        _report(run_dir, status)
    try:
        handler.shutdown()
    except Exception as exc:
        logger.debug("rendezvous shutdown: %s", exc)


def _outcome(
    result: Any,
    stopped_by: int | None,
    agent: RankguardAgent,
    services: NodeServices,
    cfg: RankguardConfig,
    max_restarts: int,
    target: str = "",
) -> JobOutcome:
    """How the job ended (for the exit code), said on the console: torchrun's failure
    summary (``target``: the script or module, as torchrun names it), then rankguard's
    verdict, which agrees with node 0's findings."""
    ft_on = cfg.fault_tolerance.enable_ft_package
    if stopped_by is not None:
        _say(f"stopped by signal {stopped_by}: the workers were terminated")
        return JobOutcome(signal=stopped_by, fault_tolerance=ft_on)
    if _grace_kills_only(result, agent):  # said with the preemption (its root cause)
        return JobOutcome(fault_tolerance=ft_on)
    if result is None or result.is_failed():
        root = first_failure(result) or agent.last_failure
        acted = agent.pending_cause
        cause = (
            as_str(acted.get("finding_type"))
            if acted is not None
            else root.finding_type
            if root is not None
            else None
        )
        summary = failure_summary(target, getattr(result, "failures", None) or {})
        if summary is not None:  # as torchrun prints it, for its users and log scrapers
            print(summary, file=sys.stderr, flush=True)
        monitor = services.monitor
        findings = monitor.episode_findings() if monitor is not None else []
        for line in root_cause_lines(
            root,
            agent.pending_cause,
            findings,
            monitored=monitor is not None,
            stopped=monitor.rules.shutdown if monitor is not None else None,
            killed_on_request=_killed_on_request(services, root),
        ):
            _say(line)
        if root is not None and root.error_file and os.path.isfile(root.error_file):
            _say(f"error file: {root.error_file} (host {socket.gethostname()})")
        if agent.restarts:
            _say(f"{agent.restarts} in-job restart(s) spent (budget {max_restarts})")
        worker_exit = root.exit_code if root is not None else None
        _say_rerun(worker_exit, services.run_dir)
        if agent.stop_decision is not None:
            _say(agent.stop_decision.line())
        return JobOutcome(
            will_repeat=agent.stop_decision is not None,
            failed=True,
            fault_tolerance=ft_on,
            aborted=agent.aborted,
            cause=cause,
            worker_exit=worker_exit,
        )
    stop_at, reason = _agreed_stop(services)
    if stop_at is not None and services.finished_before_stop():
        # too late: the ranks were done (the preemption says its own line)
        if not str(reason).startswith("preempt"):
            _say(
                f"every rank finished training and exited 0 before the agreed stop step "
                f"({_stop_words(services, stop_at)}; {reason}): the job completed"
            )
        stop_at = None
    elif stop_at is not None and not str(reason).startswith("preempt"):
        _say(f"every rank stopped {_stop_words(services, stop_at)} (stop_if_detected)")
    return JobOutcome(fault_tolerance=ft_on, stop_at=stop_at)


def _stop_words(services: NodeServices, stop_at: int) -> str:
    """The agreed stop step in words that say its numbering (node 0 knows the
    script's step where the heartbeats told it)."""
    from rankguard.monitor.agree import stop_words

    agreed = services.agreement
    return stop_words(stop_at, agreed.script_step if agreed is not None else None)


def _agreed_stop(services: NodeServices) -> tuple[int | None, str | None]:
    """The step every rank was asked to stop at, and why: node 0's agreement, or, on
    another node, the ``control.json`` its ranks read (node 0 wrote it into the shared
    run directory, or this node's relay from the store). Every node then exits 13 for a
    straggler's stop, not only node 0 (the others said 0: 'completed')."""
    agreed = services.agreement
    if agreed is not None:
        return agreed.stop_at, agreed.reason
    from rankguard.monitor.agree import ControlReader

    control = ControlReader(services.run_dir)
    control.poll()
    return control.stop_at_step, control.reason


def _grace_kills_only(result: Any, agent: RankguardAgent) -> bool:
    """The group failed only because the preemption's grace window ran out: every
    failure is a rank rankguard killed at the grace limit, not a failure of the job."""
    pre = agent.preemption
    failures = getattr(result, "failures", None) or {}
    if pre is None or not pre.active or not pre.terminated or not failures:
        return False
    killed = set(pre.terminated)
    return all(f.pid in killed for f in failures.values())


def _killed_on_request(services: NodeServices, root: WorkerFailure | None) -> bool:
    """This node's relay killed the root cause's rank for node 0's fault tolerance."""
    relay = services.relay
    return root is not None and relay is not None and root.pid in relay.killed


def _say_rerun(worker_exit: int | None, run_dir: Path) -> None:
    """The rerun state machine's verdict behind an exit 16 or 17."""
    if worker_exit == EXIT_RERUN_RESUME:
        _say(
            "exit 16: a failed check reproduced in place: resume the job (on other "
            "hardware) to re-run the iteration from the checkpoint the rerun state machine "
            "saved (its persistent_fault finding says whether it had one to save)"
        )
    elif worker_exit == EXIT_RERUN_VALIDATION_FAILED:
        from rankguard.rerun.verdict import read_verdict

        verdict = read_verdict(run_dir) or {}
        for c in [as_dict(c) or {} for c in as_list(verdict.get("faulty"))] or [{}]:
            _say(
                f"exit 17: validation failed at iteration {verdict.get('iteration', '?')}: "
                f"rank {c.get('rank', '?')}'s first run was faulty: host "
                f"{c.get('hostname', '?')}, GPU {c.get('gpu', '?')}: exclude that node"
            )


def _report(run_dir: Path, status: JsonObject | None) -> None:
    _say(run_end_line(status))
    doc = StatusDoc.from_dict(status or {})
    if doc.monitor.errors:
        _say(
            f"monitor: {doc.monitor.errors} scan(s) FAILED during the run (nothing was "
            f"monitored meanwhile); last: {doc.monitor.last_error}"
        )
    for finding in doc.recent_findings:
        _say(f"  finding: {finding.get('message')}")
    _say(f"status:   {run_dir / layout.STATUS_FILE}")
    _say(f"findings: {run_dir / layout.FINDINGS_FILE}")
    _say(f"see: rankguard status {run_dir}")
    _say(f"     rankguard report {run_dir}")
