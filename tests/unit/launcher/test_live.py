"""The agent's side of live recovery (:mod:`rankguard.launcher.live`) on fake processes
and an in-memory store: a lost rank handed to a standby, or the group restart said."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerState

from rankguard.launcher.console import live_recovery_line
from rankguard.launcher.live import LiveRecovery
from rankguard.live.keys import REPLACING, LiveKeys
from rankguard.live.plan import Resumed
from rankguard.schema.restarts import LostRank
from tests.factories import DictStore

NPROC, STANDBYS = 4, 1


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig


class FakeContext:
    def __init__(
        self, tmp: Path, *, nproc: int = NPROC, standbys: int = STANDBYS, pid0: int = 100
    ) -> None:
        slots = range(nproc + standbys)
        self.subprocess_handlers = {s: SimpleNamespace(proc=FakeProc(pid0 + s)) for s in slots}
        self.error_files = {s: str(tmp / f"error_{s}.json") for s in slots}
        self.entrypoint = "python"
        self.args = {s: ("train.py",) for s in slots}
        self.envs = {s: {"LOCAL_RANK": str(s), "TORCHELASTIC_ERROR_FILE": ""} for s in slots}
        self.stdouts = {s: str(tmp / f"{s}" / "stdout.log") for s in slots}
        self.stderrs = {s: "" for s in slots}

    def end(self, slot: int, code: int) -> None:
        self.subprocess_handlers[slot].proc.returncode = code


class FakeStarts:
    """Standby processes started to refill (pids from 200): what each was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def __call__(self, **kw: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        self.calls.append(kw)
        return SimpleNamespace(proc=FakeProc(199 + len(self.calls)))


def _live(
    tmp: Path, *, refills: int | None = 0, starts: FakeStarts | None = None
) -> tuple[LiveRecovery, FakeContext, DictStore, list[str], Any]:
    store = DictStore()
    lines: list[str] = []
    lost: list[LostRank] = []
    live = LiveRecovery(
        run_id="r1",
        nproc=NPROC,
        standbys=STANDBYS,
        say=lines.append,
        on_lost=lost.append,
        store_factory=lambda host, port: store,
        start=starts or FakeStarts(),
        refills=refills,
    )
    group = SimpleNamespace(
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=1,
        workers=[SimpleNamespace(global_rank=s) for s in range(NPROC + STANDBYS)],
    )
    live.started(group, 0)
    return live, FakeContext(tmp), store, lines, (group, lost)


def test_a_killed_rank_goes_to_the_standby_without_a_group_restart(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, lost) = _live(tmp_path)
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    ctx.end(2, -9)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert store.get(keys.lost(2)) == REPLACING
    got = json.loads(store.get(keys.assign(104)))
    assert (got["rank"], got["local_rank"], got["lost_pid"]) == (2, 2, 102)
    assert live.holders[2] == 4 and live.waiting == []
    assert lines == [
        "live recovery: rank 2 (pid 102, SIGKILL) is taken over by standby pid 104; "
        "no group restart (0 standby(s) left on this node)"
    ]
    live.wait_told()
    assert [(e.rank, e.pid, e.standby_pid) for e in lost] == [
        (2, 102, 104)
    ]  # the finding naming the lost rank
    status = live.status()
    assert (status.waiting, status.used) == (0, 1)
    assert status.replaced[0].standby_pid == 104
    # the line waits for the newcomer's first step, then has its cost
    assert live.entries_due() == []
    fault_t = live.replaced[0]["fault_t"]
    resumed = Resumed(t=fault_t + 0.5, step=11, steps_redone=0, source="replica on rank 0")
    store.set(keys.resumed(104), resumed.to_json())
    (entry,) = live.entries_due()
    assert entry.kind == "live_recovery" and entry.cause == "rank_process_exited"
    assert (entry.number("recovery_s"), entry.number("steps_redone")) == (0.5, 0)
    assert entry.number("resumed_step") == 11
    assert entry.number("resumed_t") == round(fault_t + 0.5, 3)
    assert entry.extra["source"] == "replica on rank 0"
    # status.json["live"] (the exporter's one source) has the cost and the source too
    (done,) = live.status().replaced
    assert (done.recovery_s, done.steps_redone) == (0.5, 0)
    assert done.source == "replica on rank 0"
    # the launcher's console line for it says where the newcomer's state came from
    assert live_recovery_line(entry.stamped("t")) == (
        "live recovery 1: rank 2 now standby pid 104 (rank_process_exited); fault -> next "
        "step 0.50 s, 0 step(s) redone; state from replica on rank 0"
    )


def test_a_second_loss_with_no_standby_left_restarts_the_group(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, _lost) = _live(tmp_path)
    store.set(LiveKeys("r1", 0).declared, "1")
    ctx.end(2, -9)
    live.poll(group, ctx)
    ctx.end(4, -9)  # the standby, now rank 2, is lost too
    result = live.poll(group, ctx)
    assert result.state == WorkerState.FAILED
    assert list(result.failures) == [2] and result.failures[2].pid == 104
    assert lines[-1] == (
        "live recovery cannot apply: rank 2 (SIGKILL) lost and no standby left on this "
        "node: the worker group restarts"
    )
    (entry,) = live.entries_due(final=True)  # written without resumed_t
    assert entry.to_dict()["resumed_t"] is None


def test_a_used_standby_is_refilled_and_a_second_loss_is_live_too(tmp_path: Path) -> None:
    starts, owned = FakeStarts(), []
    live, ctx, store, lines, (group, _lost) = _live(tmp_path, refills=None, starts=starts)
    live.on_started = owned.append
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    ctx.end(2, -9)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    # a new standby in the lost process's slot, started as the used one was (slot 4's
    # command line and environment), its log beside the lost one's, not over it
    (call,) = starts.calls
    assert (call["entrypoint"], call["args"], call["local_rank_id"]) == ("python", ("train.py",), 2)
    assert call["env"]["LOCAL_RANK"] == "4"
    assert call["env"]["TORCHELASTIC_ERROR_FILE"] == ctx.error_files[2]
    assert call["stdout"] == str(tmp_path / "2" / "stdout.standby1.log")
    assert ctx.subprocess_handlers[2].proc.pid == 200 and owned == [200]
    assert live.waiting == [2]
    assert lines[-1] == (
        "live recovery: new standby pid 200 started in place of rank 2's lost process; "
        "standbys on this node: 1 waiting, 1 used, 1 started to refill"
    )
    status = live.status()
    assert (status.waiting, status.used, status.started) == (1, 1, 1)
    ctx.end(4, -9)  # the first standby, now rank 2, is lost: the new one takes it
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    got = json.loads(store.get(keys.assign(200)))
    assert (got["rank"], got["lost_pid"]) == (2, 104)
    assert live.holders[2] == 2
    assert len(starts.calls) == 2 and live.waiting == [4]
    # started as a standby again (slot 2's process was started as one), not with the
    # environment of the training rank slot 2 held first: that one joined the rounds as
    # a second rank 2 and ended on its hard timeout
    assert starts.calls[1]["env"]["LOCAL_RANK"] == "4"
    assert starts.calls[1]["local_rank_id"] == 4


def test_a_refill_that_cannot_start_is_said(tmp_path: Path) -> None:
    starts = FakeStarts()
    starts.fail = OSError("no memory")
    live, ctx, store, lines, (group, _lost) = _live(tmp_path, refills=None, starts=starts)
    store.set(LiveKeys("r1", 0).declared, "1")
    ctx.end(1, -9)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY  # the recovery itself is live
    assert lines[-1] == (
        "live recovery: no new standby started (no memory); standbys on this node: "
        "0 waiting, 1 used, 0 started to refill"
    )
    ctx.end(4, -9)
    assert live.poll(group, ctx).state == WorkerState.FAILED


def test_no_declared_state_is_a_group_restart_with_one_line(tmp_path: Path) -> None:
    live, ctx, _store, lines, (group, lost) = _live(tmp_path)
    ctx.end(1, -9)
    assert live.poll(group, ctx).state == WorkerState.FAILED
    assert lines == [  # the one line the user reads, in full
        "live recovery cannot apply: rank 1 (SIGKILL) lost, but the script declares no live "
        "state (rankguard.inprocess.live_state): a standby could not get it: the worker "
        "group restarts"
    ]
    live.wait_told()
    assert lost == [] and live.waiting == [4]


def test_a_python_error_is_not_recovered_live(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, _lost) = _live(tmp_path)
    store.set(LiveKeys("r1", 0).declared, "1")
    Path(ctx.error_files[3]).write_text('{"message": "boom"}')
    ctx.end(3, 1)
    assert live.poll(group, ctx).state == WorkerState.FAILED
    assert "Python error" in lines[0]


def test_a_standby_ending_early_is_said_not_a_failure(tmp_path: Path) -> None:
    live, ctx, _store, lines, (group, _lost) = _live(tmp_path)
    ctx.end(4, -9)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert live.waiting == [] and live.status().left_unused == 1
    assert lines == [
        "live recovery: standby pid 104 ended (SIGKILL) before it was needed; 0 standby(s) "
        "left on this node"
    ]


def _at_its_wait(store: DictStore, pid: int) -> None:
    store.set(LiveKeys("r1", 0).waiting(pid), "1")  # as LiveLink.await_assignment does


def test_success_once_the_ranks_completed_and_the_standbys_left(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, _lost) = _live(tmp_path)
    _at_its_wait(store, 104)
    for slot in range(NPROC):
        ctx.end(slot, 0)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY  # the standby still leaving
    assert ctx.subprocess_handlers[4].proc.signals == []  # at its wait: it leaves by itself
    ctx.end(4, 0)
    result = live.poll(group, ctx)
    assert result.state == WorkerState.SUCCEEDED
    assert sorted(result.return_values) == list(range(NPROC + STANDBYS))  # torch's numbers
    assert lines == []  # a healthy run: no standby activity


def test_a_standby_still_starting_is_ended_when_the_ranks_complete(tmp_path: Path) -> None:
    """A refill started late (importing torch) reads ``finished`` only once it is at its
    wait: it is ended at once, not waited for ``STANDBY_LEAVE_S``."""
    live, ctx, _store, _lines, (group, _lost) = _live(tmp_path)
    for slot in range(NPROC):
        ctx.end(slot, 0)
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert ctx.subprocess_handlers[4].proc.signals == [15]  # SIGTERM: it holds nothing
    assert live.poll(group, ctx).state == WorkerState.SUCCEEDED  # gone: no 10 s wait


def test_a_standby_that_does_not_leave_is_ended(tmp_path: Path, monkeypatch: Any) -> None:
    import rankguard.launcher.live as mod

    live, ctx, store, _lines, (group, _lost) = _live(tmp_path)
    _at_its_wait(store, 104)
    monkeypatch.setattr(mod, "STANDBY_LEAVE_S", 0.0)
    for slot in range(NPROC):
        ctx.end(slot, 0)
    assert live.poll(group, ctx).state == WorkerState.SUCCEEDED
    assert ctx.subprocess_handlers[4].proc.signals == [9]


def test_a_torn_error_file_is_dropped_not_fatal(tmp_path: Path) -> None:
    live, ctx, _store, _lines, (group, _lost) = _live(tmp_path)
    Path(ctx.error_files[1]).write_text('{"message": ')  # cut short by the kill
    ctx.end(1, -9)
    result = live.poll(group, ctx)  # no declared state: the group restart
    assert result.state == WorkerState.FAILED and result.failures[1].exitcode == -9
    assert not Path(ctx.error_files[1]).exists()


def test_would_replace_says_whether_a_standby_takes_a_hung_rank(tmp_path: Path) -> None:
    """Fault tolerance asks before it kills a hung rank (the monitor's thread)."""
    live, ctx, store, _lines, (group, _lost) = _live(tmp_path)
    assert not live.would_replace(2)  # the script has not declared its state yet
    store.set(LiveKeys("r1", 0).declared, "1")
    assert live.would_replace(2) and live.would_replace(0)
    assert not live.would_replace(NPROC)  # another node's rank
    live.stopping = "the job is preempted"
    assert not live.would_replace(2)
    live.stopping = None
    ctx.end(2, -9)
    live.poll(group, ctx)  # the one standby took rank 2
    assert not live.would_replace(1)  # none left


def test_the_watch_does_not_wait_for_the_monitor_to_take_the_lost_rank(
    tmp_path: Path,
) -> None:
    """The monitor's scan may be busy for seconds (a hang's stack dumps, after a kill
    live recovery answers): the standby gets the rank and the poll returns meanwhile."""
    import threading

    live, ctx, store, lines, (group, _lost) = _live(tmp_path)
    scan_busy = threading.Event()
    got: list[LostRank] = []

    def on_lost(lost: LostRank) -> None:
        scan_busy.wait(5.0)
        got.append(lost)

    live.on_lost = on_lost
    store.set(LiveKeys("r1", 0).declared, "1")
    ctx.end(2, -9)
    t0 = time.monotonic()
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert time.monotonic() - t0 < 2.0
    assert json.loads(store.get(LiveKeys("r1", 0).assign(104)))["rank"] == 2
    assert lines and got == []
    scan_busy.set()
    live.wait_told()
    assert [(e.rank, e.standby_pid) for e in got] == [(2, 104)]


# ---- several nodes: a lost node's ranks taken over by another node's standby ---------


def _node(
    tmp: Path, node: int, store: DictStore, clock: list[float], nnodes: int = 2
) -> tuple[LiveRecovery, FakeContext, Any, list[str], list[LostRank], list[int]]:
    """Node ``node`` of ``nnodes``, one training rank and one standby each, on ``store``."""
    lines: list[str] = []
    lost: list[LostRank] = []
    nodes_lost: list[int] = []
    live = LiveRecovery(
        run_id="r1",
        nproc=1,
        standbys=1,
        say=lines.append,
        on_lost=lost.append,
        store_factory=lambda host, port: store,
        start=FakeStarts(),
        refills=0,
        on_node_lost=nodes_lost.append,
    )
    group = SimpleNamespace(
        group_rank=node,
        master_addr="127.0.0.1",
        master_port=1,
        workers=[
            SimpleNamespace(global_rank=2 * node + s, world_size=2 * nnodes) for s in range(2)
        ],
    )
    live.started(group, 0)
    live.nodes.clock = lambda: clock[0]
    ctx = FakeContext(tmp / f"n{node}", nproc=1, standbys=1, pid0=100 * (node + 1))
    return live, ctx, group, lines, lost, nodes_lost


def test_a_lost_nodes_rank_goes_to_a_standby_of_node_0_with_its_own_local_rank(
    tmp_path: Path,
) -> None:
    store, clock = DictStore(), [1000.0]
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    live0, ctx0, group0, lines0, lost0, nodes_lost = _node(tmp_path, 0, store, clock)
    live1, ctx1, group1, _, _, _ = _node(tmp_path, 1, store, clock)
    assert live1.poll(group1, ctx1).state == WorkerState.HEALTHY  # node 1's view: rank 1
    clock[0] += 2.0  # node 1 lost: its launcher silent, its rank awaited by rank 0
    store.set(keys.awaited(1), f"{clock[0]:.3f}")
    assert live0.poll(group0, ctx0).state == WorkerState.HEALTHY
    assert store.get(keys.lost(1)) == REPLACING
    got = json.loads(store.get(keys.assign(101)))  # node 0's standby, slot 1
    assert (got["rank"], got["local_rank"], got["lost_pid"]) == (1, 1, 200)
    assert live0.holders == {0: 0, 1: 1} and live0.waiting == []
    assert lines0 == [
        "live recovery: node 1 lost (its launcher silent 2.0 s, its ranks awaited by the "
        "survivors): its ranks go to other nodes' standbys (node 0: rank(s) 1); no group "
        "restart",
        "live recovery: rank 1 of lost node 1 (pid 200) is taken over by standby pid 101 of "
        "this node (LOCAL_RANK 1); no group restart (0 standby(s) left on this node)",
    ]
    assert nodes_lost == [1] and live0.node_lost
    live0.wait_told()
    assert [(e.rank, e.pid, e.standby_pid, e.node) for e in lost0] == [(1, 200, 101, 1)]
    assert live0.status().used == 1
    # node 1's launcher, back after a stall, does not replace the rank node 0 took
    ctx1.end(0, -9)
    assert live1.poll(group1, ctx1).state == WorkerState.HEALTHY
    assert not store.check([keys.assign(201)])
    # the run ends when node 0's two training ranks (its own and the adopted) complete
    ctx0.end(0, 0)
    assert live0.poll(group0, ctx0).state == WorkerState.HEALTHY
    ctx0.end(1, 0)
    assert live0.poll(group0, ctx0).state == WorkerState.SUCCEEDED
    # its last view holds no rank: its launcher's silence from now on is no loss
    assert json.loads(store.get(keys.node(0)))["ranks"] == {}


def test_no_standby_on_the_other_nodes_leaves_the_lost_node_to_todays_path(
    tmp_path: Path,
) -> None:
    store, clock = DictStore(), [1000.0]
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    live0, ctx0, group0, lines0, _, nodes_lost = _node(tmp_path, 0, store, clock)
    live1, ctx1, group1, _, _, _ = _node(tmp_path, 1, store, clock)
    live1.poll(group1, ctx1)
    ctx0.end(1, 1)  # node 0's standby gone before it was needed
    live0.poll(group0, ctx0)
    clock[0] += 2.0
    store.set(keys.awaited(1), f"{clock[0]:.3f}")
    assert live0.poll(group0, ctx0).state == WorkerState.HEALTHY
    assert not store.check([keys.lost(1)]) and not store.check([keys.take(0)])
    assert lines0[-1] == (
        "live recovery cannot apply: node 1's rank(s) 1 lost and 0 standby(s) waiting on the "
        "other nodes: today's path (the group restart, a hot spare or shrink)"
    )
    assert nodes_lost == [] and not live0.node_lost


def test_a_recovery_on_node_1_is_written_and_told_by_node_0(tmp_path: Path) -> None:
    store, clock = DictStore(), [1000.0]
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    live0, ctx0, group0, _, lost0, _ = _node(tmp_path, 0, store, clock)
    live1, ctx1, group1, lines1, lost1, _ = _node(tmp_path, 1, store, clock)
    ctx1.end(0, -9)  # node 1's rank 1: its own standby takes it
    assert live1.poll(group1, ctx1).state == WorkerState.HEALTHY
    assert json.loads(store.get(keys.assign(201)))["local_rank"] == 0
    assert "is taken over by standby pid 201" in lines1[-1]
    live0.poll(group0, ctx0)
    live0.wait_told()
    live1.wait_told()
    assert lost1 == []  # node 1 has no monitor: node 0 writes the finding
    assert [(e.rank, e.pid, e.standby_pid, e.node) for e in lost0] == [(1, 200, 201, 1)]
    store.set(keys.resumed(201), Resumed(t=2e9, step=5, steps_redone=0).to_json())
    (entry,) = live0.entries_due()
    assert (entry.number("lost_rank"), entry.number("node")) == (1, 1)
    assert live0.status().replaced[0].standby_pid == 201


def test_a_lost_nodes_rank_taken_by_node_2_is_written_and_told_by_node_0(
    tmp_path: Path,
) -> None:
    """Three nodes, node 0's standby gone: node 1's rank goes to node 2's standby, whose
    recovery reaches node 0 through the store (its line, the lost rank's finding)."""
    store, clock = DictStore(), [1000.0]
    keys = LiveKeys("r1", 0)
    store.set(keys.declared, "1")
    live0, ctx0, group0, lines0, lost0, _ = _node(tmp_path, 0, store, clock, 3)
    live1, ctx1, group1, _, _, _ = _node(tmp_path, 1, store, clock, 3)
    live2, ctx2, group2, lines2, lost2, _ = _node(tmp_path, 2, store, clock, 3)
    ctx0.end(1, 1)  # node 0's standby gone before it was needed
    for live, ctx, group in ((live0, ctx0, group0), (live1, ctx1, group1), (live2, ctx2, group2)):
        live.poll(group, ctx)
    clock[0] += 2.0  # node 1 lost; nodes 0 and 2 go on
    store.set(keys.awaited(1), f"{clock[0]:.3f}")
    live2.poll(group2, ctx2)
    live0.poll(group0, ctx0)
    assert "(node 2: rank(s) 1); no group restart" in lines0[-1]
    live2.poll(group2, ctx2)  # node 2 takes its claim
    got = json.loads(store.get(keys.assign(301)))
    assert (got["rank"], got["local_rank"], got["lost_pid"]) == (1, 1, 200)
    assert live2.holders == {2: 0, 1: 1}
    assert "rank 1 of lost node 1 (pid 200) is taken over by standby pid 301" in lines2[-1]
    clock[0] += 0.5
    live0.poll(group0, ctx0)  # node 0 collects node 2's recovery
    live0.wait_told()
    live2.wait_told()
    assert lost2 == []
    assert [(e.rank, e.pid, e.standby_pid, e.node) for e in lost0] == [(1, 200, 301, 1)]
    (done,) = live0.status().replaced
    assert (done.lost_rank, done.standby_pid) == (1, 301)
    assert live2.node_lost  # its exit barrier is shortened too


def test_no_standby_left_with_shrink_the_job_goes_on_with_fewer_ranks(tmp_path: Path) -> None:
    """``inprocess_restart.shrink_when_no_standby`` (the ranks said so with their state):
    the second loss, with no standby left, drops the rank instead of restarting."""
    live, ctx, store, lines, (group, lost) = _live(tmp_path)
    keys = LiveKeys("r1", 0)
    store.set(keys.shrink, "1")
    store.set(keys.declared, "1")
    ctx.end(2, -9)
    live.poll(group, ctx)  # the standby (pid 104) takes rank 2
    ctx.end(1, -9)  # rank 1 with no standby left
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert store.get(keys.lost(1)) == "dropped 101"
    assert sorted(live.holders) == [0, 2, 3]
    assert lines[-1] == (
        "live recovery: rank 1 (pid 101, SIGKILL) lost and no standby left on this node: "
        "the job goes on with 3 of 4 rank(s) in process "
        "(inprocess_restart.shrink_when_no_standby; renumbered: 2->1, 3->2); no group restart"
    )
    live.wait_told()
    assert [(e.rank, e.pid, e.standby_pid) for e in lost] == [(2, 102, 104), (1, 101, 0)]
    status = live.status()
    assert status.used == 1  # a shrink uses no standby
    assert status.world_size == 3
    assert [(r.lost_rank, r.lost_pid, r.standby_pid) for r in status.shrunk] == [(1, 101, None)]
    assert live.entries_due() == []  # nothing resumed yet: both lines wait
    fault_t = live.shrunk[0]["fault_t"]
    store.set(keys.resumed(104), Resumed(t=fault_t - 1, step=6, steps_redone=0).to_json())
    # the first step of the smaller world, recorded under the dropped process's pid
    store.set(keys.resumed(101), Resumed(t=fault_t + 0.25, step=13, steps_redone=0).to_json())
    replaced, shrunk = live.entries_due()
    assert replaced.number("lost_rank") == 2 and replaced.number("standby_pid") == 104
    line = shrunk.to_dict()
    assert (line["kind"], line["shrink"], line["lost_rank"], line["lost_pid"]) == (
        "live_recovery",
        True,
        1,
        101,
    )
    assert line["standby_pid"] is None and line["restart"] == 2
    assert (line["world_size"], line["world_size_before"]) == (3, 4)
    assert line["renumbered"] == {"2": 1, "3": 2}
    assert (line["recovery_s"], line["resumed_step"]) == (0.25, 13)
    # the three ranks left complete: the run succeeded, standbys gone
    for slot in (0, 3, 4):
        ctx.end(slot, 0)
    assert live.poll(group, ctx).state == WorkerState.SUCCEEDED


def test_shrink_not_asked_for_is_the_group_restart(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, _lost) = _live(tmp_path)
    store.set(LiveKeys("r1", 0).declared, "1")  # the state, without the shrink key
    ctx.end(4, 0)  # the standby left
    ctx.end(1, -9)
    assert live.poll(group, ctx).state == WorkerState.FAILED
    assert lines[-1] == (
        "live recovery cannot apply: rank 1 (SIGKILL) lost and no standby left on this "
        "node: the worker group restarts"
    )


def test_a_healthy_run_with_shrink_says_nothing(tmp_path: Path) -> None:
    live, ctx, store, lines, (group, lost) = _live(tmp_path)
    keys = LiveKeys("r1", 0)
    store.set(keys.shrink, "1")
    store.set(keys.declared, "1")
    for slot in range(NPROC + STANDBYS):
        ctx.end(slot, 0)
    assert live.poll(group, ctx).state == WorkerState.SUCCEEDED
    assert lines == [] and lost == [] and live.entries_due(final=True) == []
    assert not any(k.startswith(keys.lost(0)[:-1]) for k in store.data)


def test_a_refill_still_starting_is_not_waited_for_then_the_job_grows_back(
    tmp_path: Path,
) -> None:
    starts = FakeStarts()
    live, ctx, store, lines, (group, _lost) = _live(tmp_path, refills=None, starts=starts)
    keys = LiveKeys("r1", 0)
    store.set(keys.shrink, "1")
    store.set(keys.declared, "1")
    ctx.end(2, -9)
    live.poll(group, ctx)  # standby 104 takes rank 2; refill pid 200 starts in slot 2
    assert live.waiting == [2] and 200 in live._starting
    ctx.end(1, -9)  # the refill is not at its wait yet: shrink now, not a wait for it
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert store.get(keys.lost(1)) == "dropped 101" and sorted(live.holders) == [0, 2, 3]
    assert "the job goes on with 3 of 4 rank(s) in process" in lines[-1]
    store.set(keys.waiting(200), "1")  # the refill reached its wait
    live._ready_seen_at = 0.0
    assert live.poll(group, ctx).state == WorkerState.HEALTHY
    assert store.get(keys.lost(1)) == REPLACING
    got = json.loads(store.get(keys.assign(200)))
    assert (got["rank"], got["local_rank"], got["lost_pid"]) == (1, 1, 101)
    assert live.holders[1] == 2 and live.waiting == [] and live.dropped == []
    assert lines[-1] == (
        "live recovery: standby pid 200 takes dropped rank 1: the job grows back to 4 "
        "rank(s) in process; no group restart (0 standby(s) left on this node)"
    )
    status = live.status()
    assert (status.used, status.world_size) == (2, 4)
    store.set(keys.resumed(200), Resumed(t=time.time(), step=20, steps_redone=0).to_json())
    grown = [e.to_dict() for e in live.entries_due(final=True) if e.to_dict().get("grow")]
    assert [(e["lost_rank"], e["standby_pid"], e["world_size"]) for e in grown] == [(1, 200, 4)]
