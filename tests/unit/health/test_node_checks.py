"""The node's own checks (NIC links, InfiniBand ports, storage, uninterruptible sleep) on
a fake sysfs and procfs, the node health service's file and findings, and bad-node
exclusion acting on them."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rankguard.config import RankguardConfig, load_config
from rankguard.health.node_checks import (
    UninterruptibleWatch,
    check_nics,
    check_storage,
    process_state,
    run_node_checks,
)
from rankguard.health.node_config import NodeHealthConfig
from rankguard.launcher import nodehealth
from rankguard.launcher.exclusion import NodeExclusion
from rankguard.launcher.features import FACTORIES
from rankguard.launcher.nodehealth import NodeHealthService
from rankguard.launcher.nodeservice import LaunchContext, NodeContext, build_services
from rankguard.schema.findings import FindingType, Reason
from rankguard.schema.layout import node_health_file_name
from tests.factories import FakeClock

pytestmark = pytest.mark.timeout(60)


def net(
    root: Path,
    name: str,
    *,
    oper: str = "up",
    carrier: str | None = "1",
    flags: str = "0x1003",
    speed: str | None = "100000",
    physical: bool = True,
) -> None:
    base = root / "class" / "net" / name
    base.mkdir(parents=True)
    (base / "operstate").write_text(oper + "\n")
    (base / "flags").write_text(flags + "\n")
    if carrier is not None:
        (base / "carrier").write_text(carrier + "\n")
    if speed is not None:
        (base / "speed").write_text(speed + "\n")
    if physical:
        (base / "device").mkdir()


def ib(root: Path, device: str, port: int, state: str, rate: str = "200 Gb/sec (4X HDR)") -> None:
    base = root / "class" / "infiniband" / device / "ports" / str(port)
    base.mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    (base / "rate").write_text(rate + "\n")
    (base / "phys_state").write_text("5: LinkUp\n")


def healthy_sysfs(root: Path) -> Path:
    net(root, "eth0")
    net(root, "lo", oper="unknown", flags="0x9", speed=None, physical=False)
    net(root, "docker0", oper="down", carrier=None, flags="0x1003", physical=False)
    net(root, "eth1", oper="down", carrier=None, flags="0x1002")  # taken down on purpose
    ib(root, "mlx5_0", 1, "4: ACTIVE")
    return root


def cfg(root: Path, **fields: Any) -> NodeHealthConfig:
    return NodeHealthConfig(enabled=True, sysfs_root=str(root), procfs_root=str(root), **fields)


def test_a_healthy_node_passes_every_check(tmp_path: Path) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    report = run_node_checks(cfg(sysfs), [tmp_path / "logs", tmp_path / "ckpt"])
    assert report.healthy, report.summary()
    targets = [(r.check, r.target) for r in report.results]
    assert targets == [
        ("nic", "eth0"),
        ("infiniband", "mlx5_0/1"),
        ("storage", str(tmp_path / "logs")),
        ("storage", str(tmp_path / "ckpt")),
    ]
    assert report.results[0].detail["speed_mbps"] == 100000
    assert report.results[1].detail["rate"] == "200 Gb/sec (4X HDR)"
    assert (tmp_path / "ckpt").is_dir() and not list((tmp_path / "ckpt").iterdir())


def test_this_machine_is_healthy(tmp_path: Path) -> None:
    """The real /sys and a real directory: a healthy machine gives no failure."""
    report = run_node_checks(NodeHealthConfig(enabled=True, min_free_mb=1), [tmp_path])
    assert report.healthy, report.summary()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"oper": "down", "carrier": "0"}, "link down (operstate down, carrier 0)"),
        ({"oper": "lowerlayerdown", "carrier": None}, "link down (operstate lowerlayerdown"),
        ({"speed": "10000"}, "link at 10000 Mb/s, below 100000 Mb/s"),
    ],
)
def test_a_nic_without_its_link_fails(tmp_path: Path, fields: dict[str, Any], problem: str) -> None:
    sysfs = tmp_path / "sys"
    net(sysfs, "eth0", **fields)
    (result,) = check_nics(cfg(sysfs, min_link_speed_mbps=100000))
    assert (result.check, result.target, result.ok) == ("nic", "eth0", False)
    assert result.problem is not None and result.problem.startswith(problem)


def test_an_infiniband_port_not_active_fails(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    ib(sysfs, "mlx5_0", 1, "4: ACTIVE")
    ib(sysfs, "mlx5_1", 1, "1: DOWN")
    results = check_nics(cfg(sysfs))
    assert [(r.target, r.ok, r.problem) for r in results] == [
        ("mlx5_0/1", True, None),
        ("mlx5_1/1", False, "port 1: DOWN"),
    ]


def test_named_nics_are_checked_even_virtual_or_missing(tmp_path: Path) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    results = check_nics(cfg(sysfs, nics=["eth1", "ib9", "mlx5_0"]))
    assert [(r.target, r.ok, r.problem) for r in results] == [
        ("eth1", False, "administratively down"),
        ("ib9", False, "no such interface"),
        ("mlx5_0/1", True, None),
    ]


def test_storage_unwritable_or_full_fails(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    (bad,) = check_storage([blocked / "ckpt"], cfg(tmp_path))
    assert not bad.ok and bad.problem is not None and bad.problem.startswith("not writable")
    (full,) = check_storage([tmp_path], cfg(tmp_path, min_free_mb=1e12))
    assert not full.ok and full.problem is not None and "MiB free, below 1e+12 MiB" in full.problem


def test_storage_whose_fsync_hangs_fails_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = os.fsync

    def hung(fd: int) -> None:  # a Lustre or NFS mount that no longer answers
        release.wait(30)
        real(fd)

    monkeypatch.setattr(os, "fsync", hung)
    started = time.monotonic()
    try:
        (result,) = check_storage([tmp_path], cfg(tmp_path, fsync_timeout_s=0.3))
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert not result.ok
    assert result.problem == "a small write and fsync did not complete within 0.3 s"


def proc(root: Path, pid: int, state: str, comm: str = "python") -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1\n")


def test_process_state_reads_past_a_command_name_with_parentheses(tmp_path: Path) -> None:
    proc(tmp_path, 7, "D", comm="pt_main) (x")
    assert process_state(tmp_path, 7) == "D"
    assert process_state(tmp_path, 8) is None
    assert process_state("/proc", os.getpid()) in ("R", "S")


def test_a_worker_in_d_state_past_the_bound_is_told_once(tmp_path: Path) -> None:
    clock = FakeClock()
    watch = UninterruptibleWatch(tmp_path, 60.0, clock=clock)
    proc(tmp_path, 10, "D")
    proc(tmp_path, 11, "S")
    assert watch.look([10, 11]) == []
    clock.t += 59
    assert watch.look([10, 11]) == []
    clock.t += 2
    assert watch.look([10, 11]) == [(10, 61.0)]
    clock.t += 10
    assert watch.look([10, 11]) == []  # once per spell
    proc(tmp_path, 10, "S")  # it came back: a new spell counts from zero
    assert watch.look([10]) == []
    proc(tmp_path, 10, "D")
    clock.t += 30
    assert watch.look([10]) == []


# ---- the service --------------------------------------------------------------------


class Services:
    """What the service asks of the node services' facade."""

    def __init__(self, pids: list[int]) -> None:
        self.found: list[Any] = []
        self.workers = self
        self._pids = pids

    def pids(self) -> dict[int, None]:
        return dict.fromkeys(self._pids)

    def report_finding(self, finding: Any) -> bool:
        self.found.append(finding)
        return True


class Agent:
    def __init__(self, exclusion: NodeExclusion | None) -> None:
        self.exclusion = exclusion


def node(tmp_path: Path, config: RankguardConfig, services: Services, agent: Any) -> NodeContext:
    said: list[str] = []
    ctx = NodeContext(
        cfg=config,
        cadence=None,  # type: ignore[arg-type]
        run_dir=tmp_path / "run",
        run_id="r1",
        node_rank=0,
        nnodes=1,
        store=None,
        relaying=False,
        monitor=None,
        agent=agent,
        say=said.append,
        services=services,
    )
    ctx.run_dir.mkdir()
    return ctx


def config(tmp_path: Path, sysfs: Path, **more: str) -> RankguardConfig:
    sets = {
        "log_dir": str(tmp_path / "logs"),
        "node_health.enabled": "true",
        "node_health.sysfs_root": str(sysfs),
        "node_health.procfs_root": str(tmp_path / "proc"),
        "node_health.min_free_mb": "1",
        "node_health.watch_interval_s": "0.05",
        **more,
    }
    return load_config(None, [f"{k}={v}" for k, v in sets.items()])


def exclusion_of(tmp_path: Path, conf: RankguardConfig) -> NodeExclusion:
    """Bad-node exclusion of a node whose GPUs are not there (no GPU check fails)."""
    return NodeExclusion(
        conf.fault_tolerance,
        run_id="r1",
        run_dir=tmp_path / "run",
        min_nodes=1,
        max_nodes=2,
        say=lambda line: None,
        health=lambda: {"status": "unavailable", "gpus": []},
    )


def test_the_service_is_registered_and_off_by_default() -> None:
    names = [name for name, _ in FACTORIES]
    assert "node_health" in names
    (service,) = [
        s for s in build_services(load_config(None, []), FACTORIES) if s.name == "node_health"
    ]
    assert type(service).__name__ == "NullService"


def test_a_healthy_node_writes_its_file_and_no_finding(tmp_path: Path) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    services = Services([])
    ctx = node(tmp_path, config(tmp_path, sysfs), services, Agent(None))
    service = NodeHealthService()
    service.start(ctx)
    service.stop()
    written = json.loads((ctx.run_dir / node_health_file_name(0)).read_text())
    assert written["status"] == "ok" and written["hostname"] == socket.gethostname()
    assert [c["target"] for c in written["checks"]][:2] == ["eth0", "mlx5_0/1"]
    assert services.found == []
    assert service.status_fields()["node_health"]["failed"] == []


def test_a_nic_down_is_a_finding_and_excludes_the_node_before_the_next_round(
    tmp_path: Path,
) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    conf = config(tmp_path, sysfs, **{"fault_tolerance.exclude_bad_nodes": "true"})
    exclusion = exclusion_of(tmp_path, conf)
    services = Services([])
    ctx = node(tmp_path, conf, services, Agent(exclusion))
    service = NodeHealthService()
    service.start(ctx)
    assert services.found == [] and exclusion.check() is None  # healthy: joins the round
    (sysfs / "class" / "net" / "eth0" / "operstate").write_text("down\n")
    decided = exclusion.check()  # before the next round: the checks run again
    service.stop()
    assert decided is not None and decided.trigger == "node_health"
    assert decided.problems == ("nic eth0: link down (operstate down, carrier 1)",)
    (finding,) = services.found
    assert finding.finding_type is FindingType.NODE_HEALTH_FAILURE
    assert finding.reason is Reason.NODE_CHECK_FAILED
    assert finding.detail["target"] == "eth0" and finding.rank == -1
    written = json.loads((ctx.run_dir / node_health_file_name(0)).read_text())
    assert written["status"] == "unhealthy"


def _launch(conf: RankguardConfig) -> LaunchContext:
    return LaunchContext(opts=None, cfg=conf, run_id="r1")  # type: ignore[arg-type]


def test_with_exclusion_a_nic_down_keeps_the_node_out_of_the_first_round(
    tmp_path: Path,
) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    (sysfs / "class" / "net" / "eth0" / "operstate").write_text("down\n")
    conf = config(tmp_path, sysfs, **{"fault_tolerance.exclude_bad_nodes": "true"})
    exclusion = exclusion_of(tmp_path, conf)
    service = NodeHealthService()
    service.attach(Agent(exclusion), _launch(conf))  # as the launch builds the agent
    decided = exclusion.check()  # before the first round: no node number yet
    assert decided is not None and decided.trigger == "node_health"
    assert decided.problems == ("nic eth0: link down (operstate down, carrier 1)",)
    assert "before the round" in decided.message and decided.node_rank is None


def test_the_checks_before_the_first_round_are_the_ones_its_file_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    conf = config(tmp_path, sysfs, **{"fault_tolerance.exclude_bad_nodes": "true"})
    exclusion = exclusion_of(tmp_path, conf)
    runs: list[int] = []
    real = nodehealth.run_node_checks
    monkeypatch.setattr(
        nodehealth, "run_node_checks", lambda *a, **k: runs.append(1) or real(*a, **k)
    )
    services = Services([])
    service = NodeHealthService()
    service.attach(Agent(exclusion), _launch(conf))
    assert exclusion.check() is None and len(runs) == 1  # healthy: joins the first round
    ctx = node(tmp_path, conf, services, Agent(exclusion))
    service.start(ctx)  # the round numbered the node: its file, from those checks
    assert len(runs) == 1
    written = json.loads((ctx.run_dir / node_health_file_name(0)).read_text())
    assert written["status"] == "ok"
    (sysfs / "class" / "net" / "eth0" / "operstate").write_text("down\n")
    decided = exclusion.check()  # before the next round: fresh checks
    service.stop()
    assert len(runs) == 2 and decided is not None and decided.trigger == "node_health"


def test_without_exclusion_a_failure_is_reported_only(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    net(sysfs, "eth0", oper="down", carrier="0")
    services = Services([])
    ctx = node(tmp_path, config(tmp_path, sysfs), services, Agent(None))
    service = NodeHealthService()
    service.start(ctx)
    service.check_now()  # the same failure again: one finding
    service.stop()
    assert [f.finding_type for f in services.found] == [FindingType.NODE_HEALTH_FAILURE]


def test_a_worker_stuck_in_d_state_is_named_and_its_node_excluded(tmp_path: Path) -> None:
    sysfs = healthy_sysfs(tmp_path / "sys")
    conf = config(
        tmp_path,
        sysfs,
        **{
            "fault_tolerance.exclude_bad_nodes": "true",
            "node_health.uninterruptible_timeout_s": "0.2",
        },
    )
    proc(tmp_path / "proc", 4242, "D")
    proc(tmp_path / "proc", 4243, "S")
    exclusion = exclusion_of(tmp_path, conf)
    services = Services([4242, 4243])
    ctx = node(tmp_path, conf, services, Agent(exclusion))
    (ctx.run_dir / "rank_3_pid_4242.heartbeat.jsonl").write_text("")
    service = NodeHealthService()
    service.start(ctx)
    deadline = time.monotonic() + 10
    while not services.found and time.monotonic() < deadline:
        time.sleep(0.05)
    service.stop()
    (finding,) = services.found
    assert finding.finding_type is FindingType.UNINTERRUPTIBLE
    assert finding.reason is Reason.UNINTERRUPTIBLE_SLEEP
    assert (finding.rank, finding.pid, finding.timeout_s) == (3, 4242, 0.2)
    assert "rank 3 (pid 4242) in uninterruptible sleep (D state)" in finding.message
    decided = exclusion.check()
    assert decided is not None and decided.trigger == "node_health"
    (problem,) = decided.problems
    assert problem.startswith("uninterruptible_sleep pid=4242 s="), problem
