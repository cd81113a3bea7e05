"""The torch elastic agent of a launch, built as torchrun builds it, and the first
console line that says what watches the job.

:func:`entrypoint` chooses the workers' entry point as torchrun does (``--no-python``,
``--run-path``, ``--module``, ``PYTHON_EXEC``), with rankguard's bootstrap in front of
a Python rank; :func:`build_agent` passes the rest of torchrun's launch config (role,
log specs, line prefix template, NUMA, filters, signals) to ``RankguardAgent``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankguard.config import RankguardConfig
from rankguard.ft.decide import RestartDecider
from rankguard.ft.policy import RestartPolicy
from rankguard.launcher.agent import RankguardAgent
from rankguard.launcher.forkwait import ForkWait
from rankguard.launcher.live import LiveRecovery
from rankguard.launcher.options import LaunchOptions
from rankguard.launcher.services import NodeServices
from rankguard.live.nodes import NODE_SILENT_S
from rankguard.schema import layout
from rankguard.schema.jsontypes import JsonObject

__all__ = [
    "LIVE_MONITOR_S",
    "build_agent",
    "entrypoint",
    "features_line",
    "live_recovery",
    "monitor_interval",
]


def _sections(ft: Any) -> str | None:
    """NVRx's section timeouts in force, ``setup 600 s, step 180 s, out of section
    300 s``; None without any."""
    out = [f"{name} {value:g} s" for name, value in ft.rank_section_timeouts.items()]
    if ft.rank_out_of_section_timeout is not None:
        out.append(f"out of section {ft.rank_out_of_section_timeout:g} s")
    return ", ".join(out) or None


def features_line(opts: LaunchOptions, cfg: RankguardConfig) -> str:
    """The first console line: what watches this job."""
    hb, ft = cfg.heartbeat, cfg.fault_tolerance
    parts = [
        f"heartbeats on (process timeout {hb.process_timeout_s:g} s, progress "
        f"{hb.progress_timeout_s:g} s)"
        if hb.enabled
        else "heartbeats OFF",
        f"perf {'on' if cfg.perf.enabled else 'off'}",
        f"fault tolerance {'on' if ft.enable_ft_package else 'off'}",
    ]
    sections = _sections(ft) if hb.enabled else None
    if sections:
        acted = (
            "a hang is acted on (fault tolerance)"
            if ft.enable_ft_package
            else "a hang is reported, nothing is killed or restarted"
        )
        parts.append(f"NVRx section timeouts {sections} (each phase's own limit; {acted})")
    for name, on in (
        ("stragglers", cfg.straggler.enabled),
        ("preemption", cfg.preemption.enable_exit_handler),
        ("rerun", cfg.rerun_state_machine.enabled),
        ("in-process restart", cfg.inprocess_restart.enabled),
    ):
        if on:
            parts.append(f"{name} on")
    if cfg.inprocess_restart.standby_ranks:
        parts.append(
            f"live recovery: {cfg.inprocess_restart.standby_ranks} standby rank(s) per node"
        )
    where = f"rendezvous {opts.rdzv_backend}" + (" (local)" if opts.standalone else "")
    budget = opts.max_restarts or ft.num_in_job_restarts or 0
    return f"monitoring: {', '.join(parts)}; {where}, restarts {budget}"


def entrypoint(opts: LaunchOptions) -> tuple[Any, list[str], str]:
    """The workers' entry point, its arguments and torch elastic's start method, as
    torchrun chooses them (``--no-python``, ``--run-path``, ``--module``,
    ``PYTHON_EXEC``), with rankguard's bootstrap in front of a Python rank."""
    from rankguard.launcher.options import ENTRY_NO_PYTHON, ENTRY_RUN_PATH

    if opts.entry == ENTRY_NO_PYTHON:  # executed as it is: no bootstrap in the rank
        return opts.target, list(opts.target_args), opts.start_method
    if opts.entry == ENTRY_RUN_PATH:  # a function in a process torch starts
        from rankguard.launcher.worker import run_path_main

        return run_path_main, [opts.target, *opts.target_args], opts.start_method
    worker_args = ["-m"] if opts.module else []
    worker_args += [opts.target, *opts.target_args]
    if opts.preload:  # torch elastic's function entry point, forked by the fork server
        from rankguard.launcher.worker import forked_main

        return forked_main, worker_args, "forkserver"
    # The start method is unused: a command entry point starts as a subprocess.
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    return python, ["-u", "-m", "rankguard.launcher.worker", *worker_args], opts.start_method


def build_agent(
    opts: LaunchOptions,
    cfg: RankguardConfig,
    handler: Any,
    services: NodeServices,
    max_restarts: int,
    run_dir: Path,
    *,
    fork_env: Mapping[str, str] | None = None,
    fork_wait: ForkWait | None = None,
) -> RankguardAgent:
    """The node's agent; ``fork_env``: with ``--preload``, the environment the fork
    server started with (the launcher's later variables are added to each forked
    rank's); ``fork_wait``: with ``--preload``, the start of the ranks told to the
    monitor (:mod:`.forkwait`)."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from rankguard.launcher.ranklogs import recording_logs_specs

    entry, entry_args, start_method = entrypoint(opts)
    elastic = opts.elastic
    extra: dict[str, Any] = {}
    if elastic is not None:  # the rest of torchrun's launch config, passed on as it does
        extra = {
            "local_addr": elastic.local_addr,
            "event_log_handler": elastic.event_log_handler,
            "numa_options": elastic.numa_options,
            "duplicate_stdout_filters": elastic.duplicate_stdout_filters,
            "duplicate_stderr_filters": elastic.duplicate_stderr_filters,
            "virtual_local_rank": elastic.virtual_local_rank,
        }
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = elastic.signals_to_handle
    standbys = cfg.inprocess_restart.standby_ranks
    spec = WorkerSpec(
        role=opts.role,
        local_world_size=opts.nproc_per_node + standbys,  # the standbys are workers too
        entrypoint=entry,
        args=tuple(entry_args),
        rdzv_handler=handler,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval(opts.monitor_interval_s, standbys),
        **extra,
    )
    logs = opts.logs_specs
    if logs is None:
        logs = DefaultLogsSpecs(log_dir=str(layout.elastic_log_dir(cfg.log_dir)))
    kw: dict[str, Any] = {}
    if opts.shutdown_timeout_s is not None:
        kw["shutdown_timeout"] = opts.shutdown_timeout_s  # torchrun's flag wins
    return RankguardAgent(
        spec=spec,
        logs_specs=recording_logs_specs(logs, run_dir),
        start_method=start_method,
        log_line_prefix_template=opts.line_prefix_template,
        on_signal=services.note_shutdown,
        on_restart=services.on_restart,
        on_failure=services.on_group_failure,
        grace_s=cfg.fault_tolerance.termination_grace_s,
        handover_timeout_s=cfg.fault_tolerance.handover_timeout_s,
        restart_policy=restart_policy(cfg, services),
        live=live_recovery(opts, cfg, services),
        on_live_recovery=services.on_live_recovery,
        fork_env=fork_env,
        fork_wait=fork_wait,
        **kw,
    )


LIVE_MONITOR_S = 0.02
"""The agent's watch of the workers with standbys: a live recovery starts at most this
long after the lost process ended (torch elastic's default is 0.1 s)."""


def monitor_interval(asked_s: float, standbys: int) -> float:
    """torch elastic's ``monitor_interval``: with standbys at most ``LIVE_MONITOR_S``
    (a cost of every live recovery; the watch is one ``poll`` of each worker process)."""
    return min(asked_s, LIVE_MONITOR_S) if standbys else asked_s


def live_recovery(
    opts: LaunchOptions, cfg: RankguardConfig, services: NodeServices
) -> LiveRecovery | None:
    """The node's standbys (``--standby-ranks``), None without."""
    standbys = cfg.inprocess_restart.standby_ranks
    if not standbys:
        return None
    live = LiveRecovery(
        run_id=services.run_id,
        nproc=opts.nproc_per_node,
        standbys=standbys,
        say=lambda line: print(f"[rankguard] {line}", file=sys.stderr, flush=True),
        on_lost=services.on_rank_lost,
        on_node_lost=services.note_node_lost,
        # a node's launcher silent this long (and its ranks awaited): lost; well within
        # the survivors' wait for a peer that cannot re-enter
        node_silent_s=max(NODE_SILENT_S, cfg.inprocess_restart.heartbeat_timeout / 4),
        refills=cfg.inprocess_restart.standby_refills,
    )
    services.live = live
    return live


def restart_policy(cfg: RankguardConfig, services: NodeServices) -> RestartPolicy:
    """The launch's restart-or-stop decisions (:mod:`rankguard.ft.decide`); a stop is a
    ``restarts.jsonl`` line on node 0, which writes that file."""

    def write(entry: JsonObject) -> None:
        if services.node_rank == 0:
            services.restarts_file.append([entry])

    ft = cfg.fault_tolerance
    decider = RestartDecider(ft.no_progress_limit, repeats=ft.exclude_after_restarts == 0)
    return RestartPolicy(decider, services.run_dir, services.run_id, write)
