"""Bad-node exclusion's decisions: the health verdict, restarts counted in a window and
attributed through the store, exit 17's faulty GPU, what an excluded node writes and
publishes, the rendezvous wrapper, and the monitor's smaller group."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import PrefixStore
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

from rankguard.config import ConfigError, load_config
from rankguard.ft.config import FaultToleranceConfig
from rankguard.health import apply_rules, collect_gpu_health, evaluate_gpu
from rankguard.health.nvml import XidWatcher
from rankguard.health.schema import GpuHealth
from rankguard.launcher.exclusion import (
    ExcludedBelowMinimum,
    Exclusion,
    NodeExcluded,
    NodeExclusion,
    RestartWindow,
    exclusion_commands,
    read_excluded,
    rerun_faulty,
    unhealthy_gpus,
)
from rankguard.launcher.exitcodes import EXIT_NODE_EXCLUDED, RETRYABLE, JobOutcome, exit_code
from rankguard.launcher.rendezvous import loopback_store_server
from rankguard.schema.findings import Finding, FindingType, Reason
from rankguard.schema.layout import StoreKeys
from tests.factories import FakeClock, heartbeat_record, heartbeat_rules, load_fake_pynvml

pytestmark = pytest.mark.timeout(60)

HOST = socket.gethostname()


def snapshot(*gpus: dict[str, Any], status: str = "ok") -> dict[str, Any]:
    return {"status": status, "gpus": apply_rules(gpus)}


def gpu(index: int = 0, **fields: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", **fields}


def exclusion(
    tmp_path: Path,
    *,
    store: Any = None,
    health: dict[str, Any] | None = None,
    min_nodes: int = 1,
    max_nodes: int = 3,
    **ft: Any,
) -> tuple[NodeExclusion, list[str]]:
    said: list[str] = []
    cfg = FaultToleranceConfig(**ft)
    ex = NodeExclusion(
        cfg,
        run_id="r1",
        run_dir=tmp_path,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        store=store,
        say=said.append,
        health=lambda: health or snapshot(gpu()),
    )
    return ex, said


@pytest.fixture
def store() -> Any:
    return loopback_store_server(0, timeout_s=10.0)


# ---- the health verdict ---------------------------------------------------------------


def test_hardware_xids_are_unhealthy_application_xids_a_warning() -> None:
    assert evaluate_gpu(gpu(xid_errors=[79])) == (GpuHealth.UNHEALTHY, ["xid=79"])
    assert evaluate_gpu(gpu(xid_errors=[13])) == (GpuHealth.WARNING, ["xid=13"])
    assert evaluate_gpu(gpu(xid_errors=[])) == (GpuHealth.OK, [])


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"xid_errors": [48]}, "xid=48"),
        ({"ecc_uncorrected_volatile": 2}, "ecc_uncorrected_volatile=2"),
        ({"retired_pages_pending": True}, "retired_pages_pending"),
        ({"query_error": "nvmlDeviceGetHandleByIndex: GPU is lost"}, "gpu_query_failed"),
        ({"remapped_rows_failure": True}, "remapped_rows_failure"),
    ],
)
def test_gpu_faults_exclude_the_node(fields: dict[str, Any], problem: str) -> None:
    bad = unhealthy_gpus(snapshot(gpu(0), gpu(1, **fields)))
    assert bad == [(1, [problem])]


def test_healthy_warning_only_or_unreadable_gpus_exclude_nothing() -> None:
    assert unhealthy_gpus(snapshot(gpu(0), gpu(1))) == []
    assert unhealthy_gpus(snapshot(gpu(0, thermal_slowdown=True, xid_errors=[31]))) == []
    assert unhealthy_gpus({"status": "unavailable", "gpus": []}) == []
    assert unhealthy_gpus({"status": "error", "gpus": [gpu(0, health="unhealthy")]}) == []
    assert unhealthy_gpus(None) == []


def test_xid_watcher_reads_nvml_events_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = load_fake_pynvml()
    config = fake.write_config(
        tmp_path / "nvml.json", [fake.make_gpu(0), fake.make_gpu(1, xid_events=[79, 13])]
    )
    monkeypatch.setenv(fake.CONFIG_ENV, str(config))
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    watcher = XidWatcher().open()
    try:
        assert watcher.available
        xids = watcher.drain()
        assert xids == {1: [79, 13]}
        assert watcher.drain() == {}  # delivered once
        snap = collect_gpu_health(command_timeout_s=5, prefer="nvml", xids=xids)
        assert [g["xid_errors"] for g in snap["gpus"]] == [[], [79, 13]]
        assert unhealthy_gpus(snap) == [(1, ["xid=79", "xid=13"])]
    finally:
        watcher.close()
    assert fake.INIT_CALLS == fake.SHUTDOWN_CALLS


# ---- restarts in a window -------------------------------------------------------------


def test_restart_window_counts_k_within_the_window() -> None:
    clock = FakeClock(0.0)
    window = RestartWindow(3, 100.0, clock)
    assert [window.note() for _ in range(2)] == [False, False]
    clock.t = 150.0  # both out of the window
    assert window.count() == 0
    assert [window.note(), window.note()] == [False, False]
    clock.t = 200.0
    assert window.note() is True and window.count() == 3


def test_restart_window_off_never_excludes() -> None:
    window = RestartWindow(0, 10.0, FakeClock(0.0))
    assert not any(window.note() for _ in range(10))


def test_only_the_first_node_to_fail_in_a_round_counts_the_restart(
    tmp_path: Path, store: Any
) -> None:
    culprit, _ = exclusion(tmp_path / "a", store=store, exclude_after_restarts=2)
    peer, _ = exclusion(tmp_path / "b", store=store, exclude_after_restarts=2)
    peer.pid = culprit.pid + 1  # another agent on this host
    failure = {"exit_code": 1, "rank": 2, "local_rank": 0}
    for round_port in (1001, 1001):  # the same port twice: the round's store tells them apart
        round_store = PrefixStore(f"torch.rendezvous.r1.{culprit.rounds}", store)
        info = RendezvousInfo(round_store, 0, 3, RendezvousStoreInfo("127.0.0.1", round_port))
        culprit.on_round(info)
        peer.on_round(info)
        culprit.note_failure(failure, [2])  # first: the culprit
        peer.note_failure({**failure, "rank": 0}, [0])  # its peer failed because of it
    assert peer.pending is None and peer.window.count() == 0
    assert culprit.pending is not None and culprit.pending.trigger == "restarts"
    assert culprit.pending.problems == ("restarts=2", "window_s=3600")
    assert culprit.pending.gpu == 0


# ---- exit 17 ----------------------------------------------------------------------------


def test_exit_17_excludes_the_node_that_holds_the_faulty_rank(tmp_path: Path) -> None:
    (tmp_path / "rerun_faulty_rank_3.json").write_text(
        json.dumps({"rank": 3, "hostname": HOST, "gpu": 1})
    )
    assert rerun_faulty(tmp_path, [2, 3]) == [{"rank": 3, "hostname": HOST, "gpu": 1}]
    bad, _ = exclusion(tmp_path, exclude_bad_nodes=True)
    failure = {"exit_code": 17, "rank": 2, "local_rank": 0}
    assert bad.final_verdict_taken(failure)
    bad.note_failure(failure, [2, 3])
    assert bad.pending is not None and (bad.pending.trigger, bad.pending.gpu) == ("rerun", 1)
    assert bad.check() is bad.pending

    healthy, _ = exclusion(tmp_path, exclude_bad_nodes=True)
    healthy.note_failure(failure, [0, 1])  # its ranks were not named: it goes on
    assert healthy.pending is None and healthy.final_verdict_taken(failure)
    # the next group's round: that verdict was read, a later exit 17 must not reuse it
    healthy.on_round(RendezvousInfo(None, 0, 2, RendezvousStoreInfo("127.0.0.1", 1)))  # type: ignore[arg-type]
    assert rerun_faulty(tmp_path, [2, 3]) == []


def test_exit_17_without_exclusion_stays_final(tmp_path: Path) -> None:
    ex, _ = exclusion(tmp_path, exclude_after_restarts=3)
    assert not ex.final_verdict_taken({"exit_code": 17})
    assert not ex.final_verdict_taken({"exit_code": 1})


# ---- leaving ------------------------------------------------------------------------------


class Inner(RendezvousHandler):
    """A rendezvous handler for the wrapper: a round, or the error a closed one raises."""

    def __init__(self, store: Any, error: Exception | None = None) -> None:
        self.store, self.error, self.closed, self.shut = store, error, False, False

    def next_rendezvous(self) -> RendezvousInfo:
        if self.error is not None:
            raise self.error
        return RendezvousInfo(self.store, 0, 2, RendezvousStoreInfo("127.0.0.1", 5))

    def get_backend(self) -> str:
        return "test"

    def is_closed(self) -> bool:
        return self.closed

    def set_closed(self) -> None:
        self.closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return "r1"

    def shutdown(self) -> bool:
        self.shut = True
        return True


def test_an_unhealthy_node_leaves_before_the_round(tmp_path: Path, store: Any) -> None:
    ex, said = exclusion(
        tmp_path,
        store=store,
        health=snapshot(gpu(0), gpu(1, xid_errors=[79])),
        exclude_bad_nodes=True,
        min_nodes=2,
        max_nodes=3,
    )
    inner = Inner(store)
    handler = ex.wrap(inner)
    with pytest.raises(NodeExcluded) as caught:
        handler.next_rendezvous()
    got = caught.value.exclusion
    assert (got.trigger, got.gpu, got.problems, got.hostname) == (
        "gpu_health",
        1,
        ("xid=79",),
        HOST,
    )
    assert not inner.closed  # 3 - 1 >= MIN 2: the others go on
    handler.shutdown()
    assert not inner.shut  # closing would end the others' rendezvous

    (line,) = [json.loads(x) for x in (tmp_path / "findings.jsonl").read_text().splitlines()]
    finding = Finding.from_dict(line)
    assert finding.finding_type is FindingType.NODE_EXCLUDED
    assert finding.reason is Reason.EXCLUDED_UNHEALTHY_GPU
    assert (finding.hostname, finding.pid, finding.rank) == (HOST, got.pid, -1)
    assert line["gpu_index"] == 1 and line["slurm_exclude"] == f"--exclude={HOST}"
    listed = read_excluded(tmp_path)
    assert listed is not None
    assert listed["hosts"] == [HOST] and listed["below_min_nodes"] is False
    assert [Exclusion.from_dict(n) for n in listed["nodes"]] == [got]
    assert any("--exclude=" in s and "kubectl taint nodes" in s for s in said)
    # published: another node reads it from the store
    keys = StoreKeys("r1")
    assert int(store.add(keys.excluded_count, 0)) == 1
    assert Exclusion.from_dict(json.loads(store.get(keys.excluded("1")))) == got
    # the other nodes print it, node 0 writes it in a finding: not "this node"
    assert got.message.startswith(f"a node (host {HOST}, launcher pid {got.pid}) excluded: ")
    assert finding.message.startswith("a node (host ")


def test_below_min_the_excluded_node_closes_the_others_end_with_the_host_list(
    tmp_path: Path, store: Any
) -> None:
    sick = snapshot(gpu(0, ecc_uncorrected_volatile=1))
    bad, said = exclusion(
        tmp_path / "bad", store=store, health=sick, exclude_bad_nodes=True, min_nodes=2, max_nodes=2
    )
    inner = Inner(store)
    with pytest.raises(NodeExcluded):
        bad.wrap(inner).next_rendezvous()
    assert inner.closed and bad.closed_it
    assert any("below --nnodes MIN 2" in s for s in said)

    other, _ = exclusion(
        tmp_path / "ok", store=store, exclude_bad_nodes=True, min_nodes=2, max_nodes=2
    )
    with pytest.raises(ExcludedBelowMinimum) as caught:
        other.wrap(Inner(store, RendezvousClosedError())).next_rendezvous()
    assert caught.value.hosts == [HOST]
    listed = read_excluded(tmp_path / "ok")
    assert listed is not None and listed["below_min_nodes"] is True
    assert listed["slurm_exclude"] == f"--exclude={HOST}"
    (line,) = [json.loads(x) for x in (tmp_path / "ok" / "findings.jsonl").read_text().splitlines()]
    assert line["reason"] == Reason.EXCLUDED_BELOW_MIN.value
    assert int(store.add(StoreKeys("r1").excluded_ended, 0)) == 1


def test_a_closed_rendezvous_without_exclusions_is_torch_elastics_error(
    tmp_path: Path, store: Any
) -> None:
    ex, _ = exclusion(tmp_path, store=store, exclude_bad_nodes=True)
    with pytest.raises(RendezvousClosedError):
        ex.wrap(Inner(store, RendezvousClosedError())).next_rendezvous()
    assert read_excluded(tmp_path) is None


def test_node_0_notes_the_others_exclusions_and_retires_their_ranks(
    tmp_path: Path, store: Any
) -> None:
    node0, said = exclusion(tmp_path, store=store, exclude_bad_nodes=True)
    retired: list[int] = []
    node0.on_shrink = lambda world: retired.append(world) or [world]
    node0.on_round(RendezvousInfo(store, 0, 3, RendezvousStoreInfo("127.0.0.1", 1)))
    gone = Exclusion("restarts", "other-host", 77, 2, 0, ("restarts=3",), "node 2 excluded")
    index = int(store.add(StoreKeys("r1").excluded_count, 1))
    store.set(StoreKeys("r1").excluded(str(index)), json.dumps(gone.to_dict()))
    node0.on_round(RendezvousInfo(store, 0, 2, RendezvousStoreInfo("127.0.0.1", 2)))
    assert retired == [2]
    (line,) = [json.loads(x) for x in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert (line["hostname"], line["node_rank"], line["trigger"]) == ("other-host", 2, "restarts")
    assert read_excluded(tmp_path)["hosts"] == ["other-host"]  # type: ignore[index]
    assert any("goes on without it" in s for s in said)


def test_healthy_node_joins_and_writes_nothing(tmp_path: Path, store: Any) -> None:
    ex, said = exclusion(tmp_path, store=store, exclude_bad_nodes=True, exclude_after_restarts=2)
    info = ex.wrap(Inner(store)).next_rendezvous()
    assert info.rank == 0 and ex.node_rank == 0 and said == []
    assert not (tmp_path / "findings.jsonl").exists() and read_excluded(tmp_path) is None


def test_scheduler_commands() -> None:
    assert exclusion_commands(["b", "a", "a"]) == {
        "slurm_exclude": "--exclude=a,b",
        "kubectl": [
            "kubectl taint nodes a rankguard.io/excluded=true:NoSchedule",
            "kubectl taint nodes b rankguard.io/excluded=true:NoSchedule",
        ],
    }
    assert exclusion_commands([]) == {"slurm_exclude": None, "kubectl": []}


def test_exclusion_round_trip_is_checked() -> None:
    e = Exclusion("gpu_health", "h", 5, None, 0, ("xid=79",), "m")
    assert Exclusion.from_dict(e.to_dict()) == e
    with pytest.raises(ValueError, match="trigger"):
        Exclusion.from_dict({**e.to_dict(), "trigger": "bored"})
    with pytest.raises(ValueError, match="hostname"):
        Exclusion.from_dict({**e.to_dict(), "hostname": ""})


# ---- the monitor's smaller group -----------------------------------------------------------


def test_rules_retire_the_ranks_past_a_smaller_group() -> None:
    rules = heartbeat_rules(None)
    for rank in range(3):
        assert rules.ingest(heartbeat_record(rank, world_size=3), now=1.0)
    rules.first_failure = (2, 1.0)
    assert rules.retire_ranks(2) == [2]
    assert sorted(rules.ranks) == [0, 1] and rules.first_failure is None
    assert not rules.ingest(
        heartbeat_record(2, seq=2, world_size=3), now=2.0
    )  # its relay's last push
    assert "retired" in (rules.last_ignored or "")
    assert rules.world_size() == 2  # ranks 0 and 1 still show the old group's records
    assert rules.ingest(heartbeat_record(2, pid=9999, world_size=3), now=3.0)  # a new process
    assert rules.world_size() == 2
    started = heartbeat_record(3, pid=9998, world_size=4, event="process_start")
    assert rules.ingest(started, now=4.0)  # a larger group formed: no cap any more
    assert rules.world_size() == 4


# ---- config and exit code --------------------------------------------------------------------


def test_config_keys_are_validated() -> None:
    cfg = load_config(
        None,
        [
            "fault_tolerance.exclude_bad_nodes=true",
            "fault_tolerance.exclude_after_restarts=3",
            "fault_tolerance.exclude_window_s=600",
        ],
    )
    ft = cfg.fault_tolerance
    assert (ft.exclude_bad_nodes, ft.exclude_after_restarts, ft.exclude_window_s) == (True, 3, 600)
    assert ft.exclusion and not FaultToleranceConfig().exclusion
    with pytest.raises((ConfigError, ValueError), match="exclude_after_restarts"):
        load_config(None, ["fault_tolerance.exclude_after_restarts=-1"])
    with pytest.raises((ConfigError, ValueError), match="exclude_window_s"):
        load_config(None, ["fault_tolerance.exclude_window_s=0"])
    with pytest.raises((ConfigError, ValueError), match="exclude_after_restart"):
        load_config(None, ["fault_tolerance.exclude_after_restart=3"])  # a typo


def test_node_excluded_exit_code_is_retryable_and_wins_over_a_failure() -> None:
    assert EXIT_NODE_EXCLUDED == 15 and EXIT_NODE_EXCLUDED in RETRYABLE
    assert exit_code(JobOutcome(excluded=True)) == 15
    assert exit_code(JobOutcome(excluded=True, failed=True, fault_tolerance=True)) == 15
    assert exit_code(JobOutcome(excluded=True, signal=15)) == 143


def test_rankguard_status_shows_the_excluded_nodes(
    tmp_path: Path, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankguard.cli.main import main

    ex, _ = exclusion(
        tmp_path, store=store, health=snapshot(gpu(0, xid_errors=[79])), exclude_bad_nodes=True
    )
    with pytest.raises(NodeExcluded):
        ex.wrap(Inner(store)).next_rendezvous()
    capsys.readouterr()
    assert main(["status", str(tmp_path)]) == 0  # no status.json: excluded before a round
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"excluded: {HOST}",
        f"  a node on {HOST} (launcher pid {ex.pid}): gpu_health, GPU 0: xid=79",
        f"  Slurm: --exclude={HOST}",
        f"  Kubernetes: kubectl taint nodes {HOST} rankguard.io/excluded=true:NoSchedule",
    ]
    assert main(["status", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["excluded"]["hosts"] == [HOST]


def test_under_slurm_each_excluded_node_names_its_host_for_the_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exclude_file = tmp_path / ".rankguard_exclude_777"
    monkeypatch.setenv("RANKGUARD_EXCLUDE_FILE", str(exclude_file))
    ex, _ = exclusion(tmp_path, health=snapshot(gpu(0, xid_errors=[79])), exclude_bad_nodes=True)
    with pytest.raises(NodeExcluded):
        ex.wrap(Inner(None)).next_rendezvous()
    assert (tmp_path / f".rankguard_exclude_777.node.{ex.pid}").read_text() == f"{HOST}\n"
    assert not exclude_file.exists()  # exit 17's file, rank 0's alone


def test_the_nodes_left_are_counted_hot_spares_included_not_max_less_the_excluded(
    tmp_path: Path, store: Any
) -> None:
    """Four agents on --nnodes 2:3 (three train, one waits as a spare); two excluded:
    two nodes remain, MIN is reached, the rendezvous stays open."""
    from rankguard.launcher.spares import AgentRegistry

    for pid in (101, 102, 103):
        reg = AgentRegistry(store, "r1", max_nodes=3, agent=f"{HOST}:{pid}")
        reg.joined(pid - 101, 3, "R1")
    AgentRegistry(store, "r1", max_nodes=3, agent=f"{HOST}:104", keepalive_s=60).waiting()
    sick = snapshot(gpu(0, ecc_uncorrected_volatile=1))
    for pid in (101, 102):
        ex, said = exclusion(
            tmp_path / str(pid),
            store=store,
            health=sick,
            exclude_bad_nodes=True,
            min_nodes=2,
            max_nodes=3,
        )
        ex.pid = pid
        inner = Inner(store)
        with pytest.raises(NodeExcluded):
            ex.wrap(inner).next_rendezvous()
        assert not inner.closed and not ex.closed_it, said
    listed = read_excluded(tmp_path / "102")
    assert listed is not None and listed["below_min_nodes"] is False


def test_without_agent_entries_the_nodes_left_are_max_less_the_excluded(
    tmp_path: Path, store: Any
) -> None:
    """No agent said where it is (not reached the rendezvous yet): MAX less the
    excluded, as before; two of 2:3 excluded is below MIN."""
    sick = snapshot(gpu(0, ecc_uncorrected_volatile=1))
    closed = []
    for pid in (101, 102):
        ex, _ = exclusion(
            tmp_path / str(pid),
            store=store,
            health=sick,
            exclude_bad_nodes=True,
            min_nodes=2,
            max_nodes=3,
        )
        ex.pid = pid
        inner = Inner(store)
        with pytest.raises(NodeExcluded):
            ex.wrap(inner).next_rendezvous()
        closed.append(inner.closed)
    assert closed == [False, True]
