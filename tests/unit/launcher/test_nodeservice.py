"""Node services: one per feature from the registry, a null object when the feature is
off, and each service called in order through the node's life (start, move, leave,
stop, finish) by ``NodeServices``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.config import RankguardConfig, build
from rankguard.launcher import features
from rankguard.launcher.exitcodes import JobOutcome
from rankguard.launcher.nodeservice import NodeContext, NullService, build_services
from rankguard.launcher.services import NodeServices


class _Recorder(NullService):
    """Records every call it gets (and the node number it was given)."""

    name = "recorder"

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def start(self, node: NodeContext) -> None:
        self.calls.append(f"start {node.node_rank} monitor={node.monitor is not None}")

    def move(self, node: NodeContext) -> None:
        self.calls.append(f"move {node.node_rank}")

    def leave(self) -> None:
        self.calls.append("leave")

    def stop(self) -> None:
        self.calls.append("stop")

    def finish(self, node: NodeContext) -> None:
        self.calls.append(f"finish {node.node_rank}")

    def status_fields(self) -> dict[str, Any]:
        return {"recorder": {"calls": len(self.calls)}}

    def outcome(self, outcome: JobOutcome) -> JobOutcome:
        self.calls.append("outcome")
        return outcome


def _cfg(**doc: Any) -> RankguardConfig:
    return build(RankguardConfig, doc)


def test_every_feature_off_is_a_null_object() -> None:
    cfg = _cfg(heartbeat={"enabled": False}, fault_tolerance={"calc_ft_timeouts": False})
    services = build_services(cfg, features.FACTORIES)
    assert [s.name for s in services] == [name for name, _ in features.FACTORIES]
    kinds = {s.name: type(s) for s in services}
    for name in ("hardware_health", "straggler", "rerun_state_machine", "preemption"):
        assert kinds[name] is NullService, name
    for name in ("calc_ft_timeouts", "prometheus"):
        assert kinds[name] is NullService, name


def test_a_feature_switched_on_gets_its_service() -> None:
    cfg = _cfg(
        heartbeat={"enabled": True, "hardware_health": {"enabled": True}},
        straggler={"enabled": True},
        rerun_state_machine={"rerun_mode": "validate_results"},
        preemption={"enable_exit_handler": True},
        fault_tolerance={"calc_ft_timeouts": True},
    )
    kinds = {s.name: type(s) for s in build_services(cfg, features.FACTORIES)}
    assert kinds["hardware_health"] is features.HealthService
    assert kinds["straggler"] is features.StragglerService
    assert kinds["rerun_state_machine"] is features.RerunService
    assert kinds["preemption"] is features.PreemptionService
    assert kinds["calc_ft_timeouts"] is features.LearnedTimeoutsService


def test_the_null_object_does_nothing() -> None:
    null = NullService("straggler")
    assert null.name == "straggler" and null.status_fields() == {}
    outcome = JobOutcome()
    assert null.outcome(outcome) is outcome
    null.leave()
    null.stop()


def test_services_are_called_in_order_through_the_nodes_life(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        "rankguard.launcher.services.FACTORIES", (("recorder", lambda cfg: _Recorder(calls)),)
    )
    services = NodeServices(
        # short intervals: the stop drains for the ranks' last records (none come
        # here) for its floor of 5 s, not the default cadence's longer wait
        cfg=_cfg(heartbeat={"enabled": True, "scan_interval_s": 0.2, "publish_interval_s": 0.2}),
        run_dir=tmp_path,
        run_id="run-order",
        node_rank=1,
        nnodes=2,
        expected_world_size=2,
    )
    services.start()  # node 1: no monitor
    services.move(0)  # node 0 now: the monitor is built before the services move
    assert services.monitor is not None
    assert services.status_fields()["recorder"] == {"calls": 2}
    services.leave()
    services.stop()
    services.outcome(JobOutcome())
    assert calls == [
        "start 1 monitor=False",
        "move 0",
        "leave",
        "stop",
        "finish 0",
        "outcome",
    ]


def test_a_service_starts_before_node_0s_monitor_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0: a service adds its evaluator to a monitor that has not scanned yet."""
    seen: list[int] = []

    class _Early(NullService):
        name = "early"

        def start(self, node: NodeContext) -> None:
            assert node.monitor is not None
            seen.append(node.monitor.scan_count)

    monkeypatch.setattr("rankguard.launcher.services.FACTORIES", (("early", lambda cfg: _Early()),))
    services = NodeServices(
        cfg=_cfg(heartbeat={"enabled": True, "scan_interval_s": 0.2}),
        run_dir=tmp_path,
        run_id="run-early",
        node_rank=0,
        nnodes=1,
        expected_world_size=1,
    )
    services.start()
    monitor = services.monitor
    assert monitor is not None
    monitor.stop(drain_timeout_s=0.0)
    assert seen == [0]


def test_the_launch_asks_every_feature_by_its_hooks_only() -> None:
    """run.py and NodeServices name no feature: hot spares, bad-node exclusion, the
    GPU preflight, NVRx's NCCL settings and the exporter's package check are services of
    the registry, reached through the NodeService hooks."""
    import ast
    import inspect

    from rankguard.launcher import run, services

    for module in (run, services):
        tree = ast.parse(inspect.getsource(module))
        used: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used.add(str(node.module))
                used.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                used.update(alias.name for alias in node.names)
        for name in (
            "rankguard.launcher.exclusion",
            "rankguard.launcher.spares",
            "rankguard.launcher.preflight",
            "NodeExclusion",
            "NodeExcluded",
            "SpareKeeper",
            "preflight_gpu_check",
            "apply_environment",
            "prometheus_client",
            "enable_gpu_health_check",
            "track_agents",
        ):
            assert name not in used, (module.__name__, name)
    cfg = _cfg(
        enable_gpu_health_check=True,
        fault_tolerance={"exclude_bad_nodes": True},
        perf={"prometheus": {"enabled": True}},
        inprocess_restart={"enabled": True},
    )
    kinds = {s.name: type(s).__name__ for s in build_services(cfg, features.FACTORIES)}
    assert kinds["gpu_health_check"] == "PreflightService"
    assert kinds["exclusion"] == "ExclusionService"
    assert kinds["elastic"] == "SpareService"
    assert kinds["prometheus"] == "ExporterService"
    names = [name for name, _ in features.FACTORIES]
    assert names.index("elastic") < names.index("exclusion")  # spares wrapped first


def test_the_inprocess_service_sets_nvrx_nccl_environment_when_asked() -> None:
    on = _cfg(inprocess_restart={"enabled": True, "set_nccl_env": True})
    off = _cfg(inprocess_restart={"enabled": True, "set_nccl_env": False})
    env_on: dict[str, str] = {}
    env_off: dict[str, str] = {}
    for cfg, env in ((on, env_on), (off, env_off)):
        for service in build_services(cfg, features.FACTORIES):
            service.environment(env)
    from rankguard.inprocess.policy import NCCL_ENV

    assert env_on == dict(NCCL_ENV) and env_off == {}


def test_the_exporter_service_says_its_missing_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from rankguard.launcher.nodeservice import LaunchContext
    from rankguard.launcher.options import LaunchOptions

    cfg = _cfg(perf={"prometheus": {"enabled": True}})
    (service,) = [s for s in build_services(cfg, features.FACTORIES) if s.name == "prometheus"]
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # not installed
    opts = LaunchOptions(target="train.py")
    launch = LaunchContext(opts=opts, cfg=cfg, run_id="r")
    problem = service.check(launch)
    assert problem is not None and "pip install 'rankguard[prometheus]'" in problem
    monkeypatch.setattr(opts, "node_rank", 1)  # only node 0 runs the exporter
    assert service.check(launch) is None
