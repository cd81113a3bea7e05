"""The rules on a full disk: a rank that goes stale where the disk is full gets
``node_disk_full`` instead of the heartbeat timeout; the episode ends when heartbeats
resume; a rank still silent one process timeout after the disk has space again gets the
timeout after all. The disk state is fed in as the monitor does, once per scan."""

from __future__ import annotations

from rankguard.monitor.rules import HeartbeatRules
from rankguard.schema.findings import Finding, FindingType
from rankguard.util.disk import DISK_FULL_BELOW_BYTES, DiskState, disk_state
from tests.factories import Feed, heartbeat_rules, types_of

FULL = DiskState(full=True, free_bytes=0, total_bytes=1 << 30)
FREE = DiskState(full=False, free_bytes=1 << 29, total_bytes=1 << 30)


def _scan(
    rules: HeartbeatRules, feed: Feed, now: float, beating: tuple[int, ...], **disks: DiskState
) -> list[Finding]:
    """One scan at ``now``: the ranks in ``beating`` publish; ``disks`` as the monitor
    measured them (``shared`` for every node, ``node<k>`` for node k)."""
    for rank in beating:
        feed.beat(rank, now, progress_seq=int(now) + 1, node_rank=rank)
    for name, disk in disks.items():
        rules.note_disk(None if name == "shared" else int(name.removeprefix("node")), disk, now)
    return rules.evaluate(now)


def test_stale_rank_on_a_full_disk_gets_node_disk_full_not_a_timeout() -> None:
    rules = heartbeat_rules()
    feed = Feed(rules)
    found: list[Finding] = []
    for t in range(0, 5):
        found += _scan(rules, feed, float(t), (0, 1), shared=FREE)
    for t in range(5, 30):  # the disk fills: rank 1 cannot write, rank 0 still can
        found += _scan(rules, feed, float(t), (0,), shared=FULL)
    assert types_of(found) == [(1, "node_disk_full")]
    f = found[0]
    assert f.info.default_action == "report" and not f.info.hang
    assert f.reason.value == "heartbeats_unwritable_on_a_full_disk"
    assert f.detail["disk"] == FULL.to_dict()
    assert f.timeout_s == 10.0 and "full" in f.message
    assert rules.ranks[1].active == {FindingType.NODE_DISK_FULL}

    # Space again; heartbeats resume at once: the episode ends, nothing more fires.
    found = _scan(rules, feed, 30.0, (0, 1), shared=FREE)
    found += _scan(rules, feed, 31.0, (0, 1), shared=FREE)
    assert found == []
    assert rules.ranks[1].active == set()

    # A second full disk later is a new episode.
    found = [f for t in range(32, 50) for f in _scan(rules, feed, float(t), (0,), shared=FULL)]
    assert types_of(found) == [(1, "node_disk_full")]


def test_only_the_node_whose_disk_is_full() -> None:
    rules = heartbeat_rules(world=3)
    feed = Feed(rules)
    found: list[Finding] = []
    for t in range(0, 3):
        found += _scan(rules, feed, float(t), (0, 1, 2), node0=FREE, node1=FREE, node2=FREE)
    for t in range(3, 20):  # node 1's disk fills; rank 2 on node 2 hangs for real
        found += _scan(rules, feed, float(t), (0,), node0=FREE, node1=FULL, node2=FREE)
    assert sorted(types_of(found)) == [(1, "node_disk_full"), (2, "rank_process_heartbeat_timeout")]


def test_still_silent_after_space_is_back_is_a_heartbeat_timeout() -> None:
    rules = heartbeat_rules()
    feed = Feed(rules)
    found: list[Finding] = []
    for t in range(0, 20):
        found += _scan(rules, feed, float(t), (0,) if t >= 3 else (0, 1), shared=FULL)
    assert types_of(found) == [(1, "node_disk_full")]
    # Space again at t=20, but rank 1 never publishes: within one process timeout (10 s)
    # the disk still explains it, then it is unresponsive after all.
    found = [f for t in range(20, 31) for f in _scan(rules, feed, float(t), (0,), shared=FREE)]
    assert found == []
    found = _scan(rules, feed, 31.0, (0,), shared=FREE)
    assert types_of(found) == [(1, "rank_process_heartbeat_timeout")]
    assert rules.ranks[1].active == {FindingType.PROCESS_TIMEOUT}


def test_no_disk_state_or_a_disk_with_space_changes_nothing() -> None:
    for disks in ({}, {"shared": FREE}):
        rules = heartbeat_rules()
        feed = Feed(rules)
        found = [
            f
            for t in range(0, 20)
            for f in _scan(rules, feed, float(t), (0,) if t >= 3 else (0, 1), **disks)
        ]
        assert types_of(found) == [(1, "rank_process_heartbeat_timeout")]


def test_a_rank_already_timed_out_is_not_reported_again_for_the_disk() -> None:
    rules = heartbeat_rules()
    feed = Feed(rules)
    found = [
        f
        for t in range(0, 20)
        for f in _scan(rules, feed, float(t), (0,) if t >= 3 else (0, 1), shared=FREE)
    ]
    found += _scan(rules, feed, 20.0, (0,), shared=FULL)
    assert types_of(found) == [(1, "rank_process_heartbeat_timeout")]


def test_peers_stalled_behind_a_rank_on_a_full_disk_are_its_victims() -> None:
    """Rank 1's node is full and rank 1 is silent; rank 0 stops progressing waiting for
    it: blocked by rank 1, no progress timeout of its own."""
    rules = heartbeat_rules()
    feed = Feed(rules)
    found: list[Finding] = []
    for t in range(0, 3):
        found += _scan(rules, feed, float(t), (0, 1), shared=FREE)
    for t in range(3, 40):
        feed.beat(0, float(t), progress_seq=3, since=float(t - 2))
        rules.note_disk(None, FULL, float(t))
        found += rules.evaluate(float(t))
    assert types_of(found) == [(1, "node_disk_full")]
    assert rules.ranks[0].blocked_by == [1]


def test_disk_state_of_a_real_directory(tmp_path: object) -> None:
    state = disk_state(str(tmp_path))
    assert state.error is None and state.free_bytes is not None and state.total_bytes
    assert state.full == (state.free_bytes < DISK_FULL_BELOW_BYTES)
    missing = disk_state("/nonexistent-dir-of-a-test")
    assert missing.full is False and missing.error


def test_disk_state_from_the_store_is_checked() -> None:
    assert DiskState.from_dict(FULL.to_dict()) == FULL
    assert DiskState.from_dict({"full": "yes"}) is None
    assert DiskState.from_dict(None) is None
    odd = DiskState.from_dict({"full": True, "free_bytes": -1, "total_bytes": "x"})
    assert odd == DiskState(full=True)


def _vanish(rules: HeartbeatRules, rank: int, now: float) -> None:
    rec = rules.ranks[rank].record
    assert rec is not None
    assert rules.ingest(rec.vanished(int(now * 1e9)), now)


def test_ranks_gone_without_process_end_while_their_disk_is_full_are_not_died() -> None:
    # The training ends while the disk is full: every rank exits cleanly, but none of
    # their process_end records can be written, so their pids just vanish.
    rules = heartbeat_rules()
    feed = Feed(rules)
    found: list[Finding] = []
    for t in range(0, 3):
        found += _scan(rules, feed, float(t), (0, 1), shared=FREE)
    for t in range(3, 20):
        found += _scan(rules, feed, float(t), (), shared=FULL)
    assert sorted(types_of(found)) == [(0, "node_disk_full"), (1, "node_disk_full")]
    _vanish(rules, 1, 20.0)
    _vanish(rules, 0, 20.0)
    found = _scan(rules, feed, 20.0, (), shared=FULL)
    found += _scan(rules, feed, 21.0, (), shared=FREE)
    assert found == []
    for rank in (0, 1):
        state = rules.ranks[rank]
        assert state.liveness.value == "exited" and state.progress.value == "unknown"
        assert state.record is not None and state.record.exit is not None
        assert "full disk" in state.record.exit["on_full_disk"]
    assert rules.first_failure is None


def test_a_rank_gone_without_process_end_on_a_free_disk_still_died() -> None:
    rules = heartbeat_rules()
    feed = Feed(rules)
    for t in range(0, 3):
        _scan(rules, feed, float(t), (0, 1), shared=FREE)
    _vanish(rules, 1, 3.0)
    found = _scan(rules, feed, 3.0, (0,), shared=FREE)
    assert [(f.rank, f.finding_type.value, f.reason.value) for f in found] == [
        (1, "rank_process_exited", "rank_process_died_without_process_end")
    ]
