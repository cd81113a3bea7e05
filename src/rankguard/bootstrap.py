"""Building a rank's session from its environment (what ``rankguard.init()`` does).

The composition root of the rank side: from the :class:`~rankguard.rank.runenv.RunEnv`
(the launcher's variables and the run's config, parsed once) it builds the parts the
config turns on (progress tracker, phase watcher, perf monitor, section statistics,
preemption handler, straggler probe, fault simulator) and hands them to a
:class:`~rankguard.session.Session` through its constructor. Three cases:

- a rank of ``rankguard run`` with heartbeats or perf on: the full session;
- plain torchrun: a local session (optimizer hook and perf monitor only, files under
  the default log directory), and one line on rank 0 saying what needs the launcher;
- anything else (or both heartbeats and perf off): the no-op
  :class:`~rankguard.session.NullSession`.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from rankguard.config import run_config
from rankguard.ft.simulate import FaultSimulator
from rankguard.ft.stats import SectionStats
from rankguard.perf.reporter import PerfReporter
from rankguard.preempt.rank import RankPreemption
from rankguard.rank import runenv
from rankguard.rank.identity import RankIdentity
from rankguard.rank.phases import PhaseWatcher
from rankguard.rank.timeline import ProgressTracker
from rankguard.schema.blocks import BlockSource, FtStatsBlock, fields_source
from rankguard.schema.layout import perf_dir
from rankguard.session import NullSession, Session, install
from rankguard.straggler.probe import SECTION_CLOCK_BUDGET_NS, ComputeProbe

if TYPE_CHECKING:
    from rankguard.perf.autodetect import PerfDetector
    from rankguard.rank.lifeline import Lifeline

__all__ = ["TORCHRUN_NOTICE", "session_from_env"]

# the public API's logger: what users filter on for the session's own lines
logger = logging.getLogger("rankguard.session")

TORCHRUN_NOTICE = (
    "rankguard: started by plain torchrun: step times, throughput and TFLOP/s are measured "
    "in each rank (files under %s); heartbeats, hang detection, stack dumps and restarts "
    "need the launcher: run this script with `rankguard run` instead of `torchrun`."
)


def session_from_env(
    env: runenv.RunEnv | None = None,
    *,
    lifeline: Lifeline | None = None,
    training_thread: threading.Thread | None = None,
) -> Session | NullSession:
    """The session this process's environment calls for (``env``: default, this
    process's). ``lifeline``: the rank bootstrap's tie to its launcher.
    ``training_thread``: the thread that runs the training loop (None: the main thread;
    see :class:`~rankguard.session.Session`)."""
    env = env or runenv.current()
    if not env.monitored:
        if env.torchrun:
            return _torchrun_session(env)
        return NullSession()
    cfg = run_config(env)
    if cfg is None:
        raise ValueError(
            f"{runenv.ENV.CONFIG}: not set, though {runenv.ENV.LAUNCHER}=1 and "
            f"{runenv.ENV.RUN_DIR} are: this rank was not started by `rankguard run`"
        )
    if not (cfg.heartbeat.enabled or cfg.perf.enabled):
        return NullSession()
    assert env.run_dir is not None  # monitored
    identity = RankIdentity.from_runenv(env)
    tracker = ProgressTracker()
    hb = cfg.heartbeat
    phases = (
        PhaseWatcher(tracker, hb.phase_patterns, training_thread=training_thread)
        if hb.phase_detection
        else None
    )
    perf = None
    if cfg.perf.enabled:
        log_dir = Path(env.log_dir or cfg.log_dir)
        perf = PerfReporter(
            cfg.perf,
            tracker,
            rank=identity.rank,
            world_size=identity.world_size,
            run_id=identity.run_id,
            # the run directory's name: the run id, or a launch's own (torchrun's default id)
            out_dir=perf_dir(log_dir, Path(env.run_dir).name),
            run_dir=Path(env.run_dir),  # rank 0 forwards its findings to perf.trackers
            job=env.job,
            cuda_device=identity.gpu.ordinal if identity.gpu else None,
            phases=phases,
        )
    ft = cfg.fault_tolerance
    blocks: list[BlockSource] = []
    if ft.calc_ft_timeouts:
        blocks.append(fields_source(FtStatsBlock, SectionStats(tracker).heartbeat_fields))
    preemption = None
    if cfg.preemption.enable_exit_handler:
        preemption = RankPreemption(
            cfg.preemption, tracker, launcher_pid=env.launcher_pid, rank=env.rank
        )
        preemption.install()
    probe = None
    if cfg.straggler.enabled and cfg.heartbeat.enabled:
        probe = ComputeProbe(
            tracker.step_end,
            every=cfg.straggler.profiling_interval,
            clock_budget_ns=SECTION_CLOCK_BUDGET_NS,
        )
    session = Session(
        identity,
        Path(env.run_dir),
        cfg.heartbeat,
        tracker=tracker,
        publish=cfg.heartbeat.enabled,
        perf=perf,
        blocks=blocks,
        probe=probe,
        phases=phases,
        detector=_detector(perf, identity.world_size),
        rerun_config=cfg.rerun_state_machine,
        preemption=preemption,
        dataloader_ignores_signal=cfg.preemption.enable_exit_handler_for_data_loader,
        lifeline=lifeline,
        env=env,
        training_thread=training_thread,
    )
    if ft.simulate_fault and env.restart_count == 0:
        FaultSimulator(
            ft, rank=identity.rank, world_size=identity.world_size, run_id=identity.run_id
        ).start()
    return session


def _detector(perf: PerfReporter | None, world_size: int) -> PerfDetector | None:
    """The batch and FLOPs detector of an unmodified script (``perf.autodetect``)."""
    if perf is None or not perf.cfg.autodetect:
        return None
    # here, not at the top: it imports torch; `import rankguard` stays torch-free
    from rankguard.perf.autodetect import PerfDetector

    return PerfDetector(perf, world_size=world_size).install()


def _torchrun_session(env: runenv.RunEnv) -> Session:
    """Plain torchrun: the in-rank parts only (progress from the optimizer hook, the
    performance monitor with its files under the default log directory), with the
    default configuration; one line on rank 0 says what is missing."""
    # here, not at the top: the root config pulls in every component's config
    from rankguard.config import RankguardConfig

    cfg = RankguardConfig()
    elastic_id = env.elastic_run_id or ""
    run_id = elastic_id if elastic_id and elastic_id != "none" else "torchrun"
    identity = RankIdentity.from_runenv(env, run_id=run_id)
    log_dir = Path(env.log_dir or cfg.log_dir).absolute()
    out_dir = perf_dir(log_dir, run_id)
    tracker = ProgressTracker()
    job = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    perf = PerfReporter(
        cfg.perf,
        tracker,
        rank=identity.rank,
        world_size=identity.world_size,
        run_id=run_id,
        out_dir=out_dir,
        job=job,
        cuda_device=identity.gpu.ordinal if identity.gpu else None,
    )
    if identity.rank == 0:
        logger.warning(TORCHRUN_NOTICE, out_dir)
    session = Session(
        identity,
        out_dir,
        cfg.heartbeat,
        tracker=tracker,
        publish=False,
        perf=perf,
        detector=_detector(perf, identity.world_size),
        env=env,
    )
    session.install_optimizer_hook()
    atexit.register(session.close)
    return session


def init() -> Session | NullSession:
    """Start monitoring for this rank (idempotent); a no-op outside the launcher."""
    return install(session_from_env)
