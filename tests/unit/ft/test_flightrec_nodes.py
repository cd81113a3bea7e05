"""The flight-recorder verdict across nodes: node 1's ranks dump into node 1's run
directory, node 1's relay sends their traces through the store on node 0's request, and
node 0 compares them with its own ranks' traces under the job's rank numbers. What comes
through the store is data from any client of it: only the answer to the request, only
the ranks asked, bounded."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.ft import flightrec
from rankguard.ft.actions import HangTraces
from rankguard.ft.flightrec import TraceDumper, trace_file, wait_for_analysers
from rankguard.ft.frremote import (
    MAX_REPLY,
    RemoteTraces,
    compact_trace,
    parse_reply,
    parse_request,
)
from rankguard.relay.relay import StoreRelay
from rankguard.schema.findings import Finding, FindingType, Liveness, Reason
from rankguard.schema.layout import StoreKeys
from rankguard.schema.payloads import PayloadError
from rankguard.schema.records import HeartbeatRecord
from rankguard.util.fs import owned_subdir, write_new_then_replace
from tests.factories import RUN_ID, DictStore, heartbeat_record

pytestmark = [pytest.mark.timeout(60)]

PER_NODE = 2


def _doc(enqueued: int, completed: int, *, frames: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"process_group": ["0", "default_pg"], "is_p2p": False}
    if frames:
        entry["frames"] = [{"name": "f", "filename": "x.py", "line": 1}] * 50
    return {
        "version": "2.10",
        "pg_status": {
            "0": {
                "last_enqueued_collective": str(enqueued),
                "last_completed_collective": str(completed),
            }
        },
        "entries": [
            {**entry, "collective_seq_id": s, "profiling_name": "gloo:all_reduce"}
            for s in range(1, enqueued + 1)
        ],
    }


class _Rank(TraceDumper):
    """A rank's dumper thread answering with a trace given by the test."""

    def __init__(self, run_dir: Path, rank: int, doc: dict[str, Any]) -> None:
        super().__init__(run_dir, rank, poll_s=0.02)
        self.doc = doc

    def dump(self) -> Path:
        owned_subdir(self.run_dir, flightrec.DUMP_DIR)
        out = trace_file(self.run_dir, self.rank)
        write_new_then_replace(out, json.dumps(self.doc).encode())
        self.answered += 1
        return out


def _record(rank: int) -> HeartbeatRecord:
    return HeartbeatRecord.from_dict(
        heartbeat_record(
            rank,
            pid=os.getpid(),
            hostname="h",
            node_rank=rank // PER_NODE,
            ranks_per_node=PER_NODE,
            world_size=2 * PER_NODE,
        )
    )


@pytest.fixture(autouse=True)
def _no_torch_analyser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flightrec, "_run_torchfrtrace", lambda d, t: "torchfrtrace: stub")


def _run_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir(mode=0o750)
    return d


def test_node1s_local_rank_1_that_did_not_join_is_named_as_global_rank_3(
    tmp_path: Path,
) -> None:
    """A 2x2 job: global rank 3 (node 1's local rank 1) never enqueued all-reduce #18,
    ranks 0, 1 (node 0) and 2 (node 1) wait in it. Node 0's own traces agree with each
    other; only node 1's, through the store, show who did not join."""
    run0, run1 = _run_dir(tmp_path, "node0"), _run_dir(tmp_path, "node1")
    docs = {0: _doc(18, 17), 1: _doc(18, 17), 2: _doc(18, 17, frames=True), 3: _doc(17, 17)}
    ranks = [_Rank(run0 if r < PER_NODE else run1, r, d) for r, d in docs.items()]
    store = DictStore()
    relay = StoreRelay(store, run1, RUN_ID, node_rank=1, interval_s=0.05)
    for r in (2, 3):
        relay.offer(heartbeat_record(r, pid=os.getpid(), node_rank=1, ranks_per_node=PER_NODE))
    states = {
        r: SimpleNamespace(
            record=_record(r), liveness=Liveness.ALIVE, collectives=None, inside_of=None
        )
        for r in docs
    }
    monitor = SimpleNamespace(rules=SimpleNamespace(ranks=states))
    sink = HangTraces(
        run0,
        monitor,  # type: ignore[arg-type]
        here=lambda rec: rec.node_rank == 0,
        remote=RemoteTraces(store, RUN_ID, timeout_s=10, poll_s=0.02),
    )
    finding = Finding(
        finding_type=FindingType.PROGRESS_TIMEOUT,
        run_id=RUN_ID,
        rank=3,
        reason=Reason.NOT_ADVANCING,
        message="rank 3: alive but no step completed",
    )
    for rank in ranks:
        rank.start()
    relay.start()
    try:
        sink.before_write(finding)
    finally:
        relay.halt()
        for rank in ranks:
            rank.stop()
        wait_for_analysers(10)
    fr = finding.detail["flight_recorder"]
    assert (fr["missing_ranks"], fr["waiting_ranks"]) == ([3], [0, 1, 2]), fr
    assert (fr["collective"], fr["seq"], fr["ranks_read"]) == ("all_reduce", 18, [0, 1, 2, 3])
    assert "flight recorder: rank(s) 3 did not join all_reduce #18" in finding.message
    # node 1's ranks wrote into node 1's run directory; node 0 read them from the store
    assert trace_file(run1, 3).exists() and not trace_file(run0, 3).exists()
    assert [r.answered for r in ranks] == [1, 1, 1, 1]
    assert not store.check([StoreKeys(RUN_ID).traces_request(1)])  # taken off the store


def test_a_lost_nodes_rank_is_not_asked_for_its_trace(tmp_path: Path) -> None:
    """Node 1 is lost (agent and ranks gone): its rank is past its heartbeat timeout,
    its relay never answers. Node 0 asked it anyway and waited the request's whole
    timeout before the finding was written; a rank whose heartbeats stopped arriving is
    not asked, node 0's own ranks are."""
    run0 = _run_dir(tmp_path, "node0")
    docs = {0: _doc(18, 17), 1: _doc(18, 17)}
    ranks = [_Rank(run0, r, d) for r, d in docs.items()]
    store = DictStore()  # no relay of node 1: it is gone
    states = {
        r: SimpleNamespace(
            record=_record(r), liveness=Liveness.ALIVE, collectives=None, inside_of=None
        )
        for r in docs
    }
    states[2] = SimpleNamespace(
        record=_record(2), liveness=Liveness.STALE, collectives=None, inside_of=None
    )
    monitor = SimpleNamespace(rules=SimpleNamespace(ranks=states))
    sink = HangTraces(
        run0,
        monitor,  # type: ignore[arg-type]
        here=lambda rec: rec.node_rank == 0,
        remote=RemoteTraces(store, RUN_ID, timeout_s=10, poll_s=0.02),
    )
    finding = Finding(
        finding_type=FindingType.PROCESS_TIMEOUT,
        run_id=RUN_ID,
        rank=2,
        reason=Reason.UNRESPONSIVE,
        message="rank 2: no heartbeat",
    )
    for rank in ranks:
        rank.start()
    t0 = time.monotonic()
    try:
        sink.before_write(finding)
    finally:
        for rank in ranks:
            rank.stop()
        wait_for_analysers(10)
    assert time.monotonic() - t0 < 5.0  # not the remote request's 10 s
    assert not store.check([StoreKeys(RUN_ID).traces_request(1)])  # node 1 not asked
    assert [r.answered for r in ranks] == [1, 1]


def test_a_trace_is_compacted_and_an_answer_is_bounded() -> None:
    doc = _doc(400, 399, frames=True)
    small = compact_trace(doc)
    assert small["pg_status"] == doc["pg_status"]
    assert [e["collective_seq_id"] for e in small["entries"]] == list(range(145, 401))
    assert not any("frames" in e for e in small["entries"])
    assert "frames" in doc["entries"][0]  # the rank's own copy is left as it was
    huge = json.dumps({"id": "a", "traces": {"0": {"x": "y" * MAX_REPLY}}})
    with pytest.raises(PayloadError, match="bytes"):
        parse_reply(huge.encode(), "a", {0})


def test_only_the_answer_to_the_request_and_only_the_ranks_asked_are_kept() -> None:
    answer = json.dumps({"id": "a", "traces": {"2": _doc(3, 3), "3": _doc(2, 2)}})
    assert sorted(parse_reply(answer, "a", {2, 3})) == [2, 3]
    with pytest.raises(PayloadError, match="another request"):
        parse_reply(answer, "b", {2, 3})
    with pytest.raises(PayloadError, match="rank 3 not asked"):
        parse_reply(answer, "a", {2})  # a node answering for a rank that is not its own
    with pytest.raises(PayloadError):
        parse_reply(json.dumps({"id": "a", "traces": {"2": [1]}}), "a", {2})
    assert parse_request(json.dumps({"id": "x", "ranks": [3, 2, 3]})) == ("x", [2, 3])
    for bad in (b"[]", b"{}", json.dumps({"id": "x", "ranks": [-1]}), b"\x80"):
        with pytest.raises(PayloadError):
            parse_request(bad)


def test_a_forged_answer_is_ignored_and_a_silent_node_ends_the_wait(tmp_path: Path) -> None:
    """A forged answer (ranks node 1 was not asked for) counts as that node's answer,
    with nothing from it; a node that never answers ends the wait at its timeout."""
    store = DictStore()
    keys = StoreKeys(RUN_ID)
    remote = RemoteTraces(store, RUN_ID, timeout_s=0.3, poll_s=0.01)
    wait = remote.ask({1: [2, 3], 2: [4, 5]})
    request_id, asked = parse_request(store.get(keys.traces_request(1)))
    assert asked == [2, 3]
    store.set(keys.traces(1), json.dumps({"id": request_id, "traces": {"0": _doc(1, 0)}}))
    assert wait() == {}
    assert remote.ignored == 1
