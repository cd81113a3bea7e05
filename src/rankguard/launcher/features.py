"""The node services of rankguard's features and their registry, :data:`FACTORIES`
(hot spares and bad-node exclusion are in :mod:`.membership`).

Each service is built from its configuration section by its factory (None when the
feature is off: :func:`~rankguard.launcher.nodeservice.build_services` puts a null
object there) and is called by :class:`~rankguard.launcher.services.NodeServices` in
the order of :data:`FACTORIES`: node 0's evaluators in the order the monitor runs them,
learned timeouts before the exporter (which stays scrapable until the very end).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from rankguard.launcher.membership import _exclusion, _spares
from rankguard.launcher.nodeservice import (
    LaunchContext,
    NodeContext,
    NodeService,
    NullService,
    ServiceFactory,
    build_services,
)
from rankguard.monitor.api import StatusFields
from rankguard.schema.layout import ft_state_dir
from rankguard.schema.statusblocks import CheckpointsBlock

if TYPE_CHECKING:
    from rankguard.config import RankguardConfig
    from rankguard.exporter.prometheus import MetricsExporter
    from rankguard.health import HealthCollector
    from rankguard.launcher.exitcodes import JobOutcome
    from rankguard.launcher.preemption import LaunchPreemption

__all__ = ["FACTORIES", "launch_services"]

logger = logging.getLogger(__name__)


class HealthService(NullService):
    """Every node: the GPU health collector (``heartbeat.hardware_health``)."""

    name = "hardware_health"

    def __init__(self) -> None:
        self.collector: HealthCollector | None = None

    def start(self, node: NodeContext) -> None:
        from rankguard.health import HealthCollector

        hw = node.cfg.heartbeat.hardware_health
        self.collector = HealthCollector(hw, node.run_dir, node.node_rank)
        self.collector.start()

    def stop(self) -> None:
        collector, self.collector = self.collector, None
        if collector is None:
            return
        try:
            collector.stop()
        except Exception:
            logger.exception("rankguard: stopping the GPU health collector failed")


def _health(cfg: RankguardConfig) -> HealthService | None:
    hb = cfg.heartbeat
    return HealthService() if hb.enabled and hb.hardware_health.enabled else None


class PreflightService(NullService):
    """Every node, before its workers start (``enable_gpu_health_check``, FlagScale's
    switch): the GPU check of :mod:`.preflight`; with bad-node exclusion the GPUs are
    checked before each rendezvous round instead."""

    name = "gpu_health_check"

    def preflight(self, launch: LaunchContext) -> int | None:
        cfg = launch.cfg
        if cfg.fault_tolerance.exclude_bad_nodes:
            launch.say(
                "enable_gpu_health_check: the node's GPUs are checked before each rendezvous "
                "round instead (fault_tolerance.exclude_bad_nodes: a bad GPU excludes the node)"
            )
            return None
        from rankguard.launcher.preflight import preflight_gpu_check

        assert launch.run_dir is not None
        return preflight_gpu_check(
            command_timeout_s=cfg.heartbeat.hardware_health.command_timeout_s,
            node_rank=launch.opts.node_rank,
            run_dir=launch.run_dir,
            say=launch.say,
        )


def _preflight(cfg: RankguardConfig) -> PreflightService | None:
    return PreflightService() if cfg.enable_gpu_health_check else None


class InProcessService(NullService):
    """Node 0: the ranks re-entering their training function, seen in their heartbeats,
    become ``restarts.jsonl`` lines of kind ``inprocess`` (the re-entry phase's timeout,
    ``inprocess_restart.hard_timeout``, is in the launcher's cadence)."""

    name = "inprocess_restart"

    def __init__(self, nccl_env: bool = False) -> None:
        self.nccl_env = nccl_env

    def environment(self, env: MutableMapping[str, str]) -> None:
        """``set_nccl_env``: NVRx's NCCL settings for an in-process restart, before the
        ranks import torch (its log level)."""
        if self.nccl_env:
            from rankguard.inprocess.policy import apply_environment

            apply_environment(env)

    def start(self, node: NodeContext) -> None:
        from rankguard.inprocess.monitor import InProcessRestarts

        if node.monitor is not None:
            on_restart = node.services.on_inprocess_restart
            node.monitor.add_evaluator(InProcessRestarts(node.run_id, on_restart))


def _node_health(cfg: RankguardConfig) -> NullService | None:
    """Every node: its NIC and storage checks and its workers' uninterruptible sleep
    (``node_health``, :mod:`rankguard.launcher.nodehealth`)."""
    from rankguard.launcher.nodehealth import NodeHealthService

    return NodeHealthService() if cfg.node_health.enabled else None


def _inprocess(cfg: RankguardConfig) -> InProcessService:
    # always: a rank may re-enter in-process under its own wrapper, without the switch
    ip = cfg.inprocess_restart
    return InProcessService(nccl_env=ip.enabled and ip.set_nccl_env)


class StragglerService(NullService):
    """Node 0: the straggler detector (``straggler``); with ``stop_if_detected`` its
    finding asks the stop agreement for a stop."""

    name = "straggler"

    def start(self, node: NodeContext) -> None:
        from rankguard.straggler.detector import StragglerDetector

        monitor = node.monitor
        if monitor is None:
            return
        detector = StragglerDetector(node.cfg.straggler, node.run_id, started_at=monitor.clock())
        monitor.add_evaluator(detector)
        node.stop_votes.append(lambda: detector.stop_requested)


def _straggler(cfg: RankguardConfig) -> StragglerService | None:
    return StragglerService() if cfg.straggler.enabled else None


class RerunService(NullService):
    """Node 0: the re-run state machine's verdicts become findings (``rerun_state_machine``)."""

    name = "rerun_state_machine"

    def start(self, node: NodeContext) -> None:
        from rankguard.rerun.evaluator import RerunEvaluator

        if node.monitor is not None:
            node.monitor.add_evaluator(RerunEvaluator(node.run_id))


def _rerun(cfg: RankguardConfig) -> RerunService | None:
    return RerunService() if cfg.rerun_state_machine.enabled else None


class UnregisteredService(NullService):
    """Node 0: rerun and in-process restart turned on by the config but never taken up
    by the script are said once (:mod:`rankguard.monitor.unregistered`)."""

    name = "unregistered_features"

    def __init__(self, features: tuple[str, ...]) -> None:
        self.features = features

    def start(self, node: NodeContext) -> None:
        from rankguard.monitor.unregistered import UnregisteredFeatures

        if node.monitor is not None:
            node.monitor.add_evaluator(UnregisteredFeatures(self.features))


def _unregistered(cfg: RankguardConfig) -> UnregisteredService | None:
    on = (
        ("rerun", cfg.rerun_state_machine.enabled),
        ("inprocess", cfg.inprocess_restart.enabled),
    )
    features = tuple(name for name, enabled in on if enabled)
    return UnregisteredService(features) if features else None


class PreemptionService(NullService):
    """Every node: the exit-signal coordination (``preemption.enable_exit_handler``),
    built once the node has its number and the agent exists; node 0's monitor runs its
    evaluator. A renumbered node keeps its first number for it."""

    name = "preemption"

    def __init__(self) -> None:
        self.launch: LaunchPreemption | None = None

    def start(self, node: NodeContext) -> None:
        from rankguard.launcher.preemption import LaunchPreemption

        if node.agent is None or self.launch is not None:
            return
        self.launch = LaunchPreemption(
            node.cfg,
            node_rank=node.node_rank,
            nnodes=node.nnodes,
            run_id=node.run_id,
            run_dir=node.run_dir,
            services=node.services,
            agent=node.agent,  # type: ignore[arg-type]
            say=node.say,
        )
        self.launch.start()

    def move(self, node: NodeContext) -> None:
        if self.launch is None:
            return
        node.say(
            "preemption: the exit-signal coordination keeps this node's first "
            "number; after the renumbering a preemption may not agree on one step "
            "until the job is restarted"
        )
        self.launch.add_evaluator(node.monitor)

    def stop(self) -> None:
        if self.launch is not None:
            self.launch.stop()

    def finish(self, node: NodeContext) -> None:
        if self.launch is not None:
            self.launch.finish()

    def outcome(self, outcome: JobOutcome) -> JobOutcome:
        return outcome if self.launch is None else self.launch.outcome(outcome)


def _preemption(cfg: RankguardConfig) -> PreemptionService | None:
    return PreemptionService() if cfg.preemption.enable_exit_handler else None


class LearnedTimeoutsService(NullService):
    """Node 0 at the end of the job (``fault_tolerance.calc_ft_timeouts``): this run's
    measurements merged into ``ft_state.json`` (:mod:`rankguard.ft.learned`)."""

    name = "calc_ft_timeouts"

    def move(self, node: NodeContext) -> None:
        return None  # learned at the end of the job only

    def finish(self, node: NodeContext) -> None:
        from rankguard.ft.learned import save_learned

        if node.monitor is None:
            return
        records = [s.record for s in node.monitor.rules.ranks.values() if s.record]
        ft = node.cfg.fault_tolerance
        save_learned(ft_state_dir(node.cfg.log_dir, ft.state_dir), ft, records)


def _learned(cfg: RankguardConfig) -> LearnedTimeoutsService | None:
    return LearnedTimeoutsService() if cfg.fault_tolerance.calc_ft_timeouts else None


class CheckpointsService(NullService):
    """Node 0: ``status.json``'s ``checkpoints`` block, read from the run's checkpoint
    registry (written by the ranks' checkpoint manager)."""

    name = "checkpoints"

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def start(self, node: NodeContext) -> None:
        self.run_dir = node.run_dir

    def stop(self) -> None:
        return None

    def status_fields(self) -> StatusFields:
        from rankguard.view.runfiles import read_checkpoints

        if self.run_dir is None:
            return {}
        block = CheckpointsBlock.from_dict(read_checkpoints(self.run_dir))
        return {} if block is None else {block.name: block}


def _checkpoints(cfg: RankguardConfig) -> CheckpointsService:
    return CheckpointsService()  # the ranks may save without the launcher's switch


class ExporterService(NullService):
    """Node 0: the Prometheus exporter (``perf.prometheus``) of the monitor's state,
    started before the first scan (no finding goes uncounted) and stopped last, after
    the final status (it stays scrapable until then)."""

    name = "prometheus"

    def __init__(self) -> None:
        self.exporter: MetricsExporter | None = None

    def check(self, launch: LaunchContext) -> str | None:
        """Node 0 (or a node not numbered yet) needs the optional prometheus-client."""
        if launch.opts.node_rank not in (0, None):
            return None
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return (
                "perf.prometheus.enabled=true needs prometheus-client: "
                "pip install 'rankguard[prometheus]'"
            )
        return None

    def start(self, node: NodeContext) -> None:
        if node.monitor is None:
            return
        # Inside: the exporter needs the optional prometheus-client.
        from rankguard.exporter import start_for_monitor

        self.exporter = start_for_monitor(node.monitor, node.cfg.perf.prometheus, node.run_dir)

    def move(self, node: NodeContext) -> None:
        self.finish(node)
        self.start(node)

    def finish(self, node: NodeContext) -> None:
        exporter, self.exporter = self.exporter, None
        if exporter is None:
            return
        try:
            exporter.stop()
        except Exception:
            logger.exception("rankguard: stopping the metrics exporter failed")


def _exporter(cfg: RankguardConfig) -> ExporterService | None:
    # without heartbeat monitoring no monitor starts it, but a launch still needs its
    # package (the check)
    return ExporterService() if cfg.perf.prometheus.enabled else None


#: The registry: (feature, factory) in the order the services are called (hot spares
#: wrap the rendezvous handler before bad-node exclusion wraps theirs; node health adds
#: its checks to the exclusion that service attached). A new node service is one more
#: line here (docs/architecture.md, "Recipes").
FACTORIES: tuple[tuple[str, ServiceFactory], ...] = (
    ("gpu_health_check", _preflight),
    ("hardware_health", _health),
    ("inprocess_restart", _inprocess),
    ("straggler", _straggler),
    ("rerun_state_machine", _rerun),
    ("unregistered_features", _unregistered),
    ("preemption", _preemption),
    ("checkpoints", _checkpoints),
    ("calc_ft_timeouts", _learned),
    ("prometheus", _exporter),
    ("elastic", _spares),
    ("exclusion", _exclusion),
    # after bad-node exclusion: it adds its checks to the exclusion's, before the first round
    ("node_health", _node_health),
)


def launch_services(cfg: RankguardConfig) -> list[NodeService]:
    """Every registered feature's service for a launch (a null one when it is off)."""
    return build_services(cfg, FACTORIES)
