"""torch's two flight recorders read as one trace: an NCCL job's collectives are in NCCL's
own recorder (``_dump_nccl_trace_json``, a CUDA build's), its CPU groups in the generic
one (``_dump_fr_trace_json``). The NCCL build is faked here (a module with both dumps,
the documents shaped as torch 2.13 writes them); ``bench/gpu_check.py`` reads the real
one on a GPU."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.ft import collectives, flightrec, recorders
from rankguard.ft.collectives import CollectiveSampler
from rankguard.ft.frverdict import compare
from rankguard.schema.collectives import GroupPosition


def _doc(backend: str, pg: str, enq: int, done: int, *, name: str | None = None) -> dict[str, Any]:
    """One recorder's dump with one group (id ``pg``, named ``name``, all-reduces 1..enq)."""
    name = pg if name is None else name
    entries = [
        {
            "pg_id": int(pg),
            "process_group": [name, "default_pg"],
            "collective_seq_id": s,
            "is_p2p": False,
            "profiling_name": f"{backend}:all_reduce",
            "input_sizes": [[4]],
            "state": "completed" if s <= done else "started",
        }
        for s in range(1, enq + 1)
    ]
    return {
        "version": "2.10",
        "pg_config": {name: {"name": name, "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            pg: {
                "last_enqueued_collective": str(enq),
                "last_completed_collective": str(done),
                "last_started_collective": "-1",
            }
        },
        "entries": entries,
    }


def _status_only(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "entries"}


def _fake_c10d(nccl: dict[str, Any] | None, generic: dict[str, Any] | None) -> SimpleNamespace:
    """A ``torch._C._distributed_c10d`` with the dumps given (None: that dump is absent)."""
    calls: list[str] = []

    def dump(doc: dict[str, Any], which: str) -> Any:
        def fn(*, includeCollectives: bool = True, onlyActive: bool = False) -> bytes:
            calls.append(which)
            return json.dumps(doc if includeCollectives else _status_only(doc)).encode()

        return fn

    fake = SimpleNamespace(calls=calls)
    if nccl is not None:
        fake._dump_nccl_trace_json = dump(nccl, "nccl")
    if generic is not None:
        fake._dump_fr_trace_json = dump(generic, "generic")
    return fake


@pytest.fixture
def c10d(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(nccl: dict[str, Any] | None, generic: dict[str, Any] | None) -> SimpleNamespace:
        fake = _fake_c10d(nccl, generic)
        monkeypatch.setattr(recorders, "_c10d", lambda: fake)
        return fake

    return install


def test_an_nccl_jobs_collectives_are_read_from_nccls_own_recorder(c10d: Any) -> None:
    # NCCL's recorder holds the job's 7 all-reduces, the generic one nothing: reading the
    # generic one alone (as before) saw no group at all
    fake = c10d(_doc("nccl", "0", 7, 6), {"version": "2.10", "pg_status": {}, "pg_config": {}})
    sampler = CollectiveSampler()
    sampler.sample()
    block = sampler.block()
    assert block is not None
    assert block.groups == (GroupPosition("0", 7, 6),) and block.inside
    assert "nccl" in fake.calls


def test_a_group_on_both_backends_is_two_positions_the_cpu_one_told_apart(c10d: Any) -> None:
    # a cpu:gloo,cuda:nccl default group: 12 NCCL all-reduces, 3 gloo barriers; both
    # recorders number the group 0: the CPU side is published as 0:cpu, never mixed in
    c10d(_doc("nccl", "0", 12, 12), _doc("gloo", "0", 3, 2))
    sampler = CollectiveSampler()
    sampler.sample()
    block = sampler.block()
    assert block is not None
    assert block.group("0") == GroupPosition("0", 12, 12)
    assert block.group("0:cpu") == GroupPosition("0:cpu", 3, 2)


def test_the_verdict_names_the_rank_behind_in_an_nccl_group(c10d: Any) -> None:
    # two ranks' traces as their dumpers write them (flightrec._trace_json): rank 1 is
    # one all-reduce behind in NCCL's recorder; the CPU group at the same count on both
    traces = {}
    for rank, (enq, done) in {0: (9, 8), 1: (8, 8)}.items():
        c10d(_doc("nccl", "0", enq, done), _doc("gloo", "0", 2, 2))
        traces[rank] = json.loads(flightrec._trace_json())
    verdict = compare(traces, world=2)
    assert verdict is not None
    assert (verdict.process_group, verdict.seq, verdict.collective) == ("0", 9, "all_reduce")
    assert verdict.missing_ranks == [1] and verdict.waiting_ranks == [0]


def test_a_cpu_build_or_a_gloo_job_reads_the_generic_recorder_unchanged(c10d: Any) -> None:
    generic = _doc("gloo", "0", 4, 4)
    c10d(None, generic)  # a build without NCCL
    assert json.loads(recorders.trace_json() or b"") == generic
    c10d({"version": "2.10", "pg_status": {}, "pg_config": {}, "entries": []}, generic)
    assert json.loads(recorders.trace_json() or b"") == generic  # NCCL's recorder empty


def test_a_recorder_that_raises_leaves_the_other_read(c10d: Any) -> None:
    fake = c10d(None, _doc("gloo", "0", 4, 4))

    def boom(**_: Any) -> bytes:
        raise RuntimeError("NCCL dump failed")

    fake._dump_nccl_trace_json = boom
    assert (
        json.loads(recorders.trace_json() or b"")["pg_status"]["0"]["last_enqueued_collective"]
        == "4"
    )
    c10d(None, None)
    assert recorders.trace_json() is None and not recorders.available()
    assert collectives._status_json() == b"{}"


def test_merge_changes_neither_document() -> None:
    nccl, gloo = _doc("nccl", "0", 2, 2), _doc("gloo", "0", 1, 1, name="5")
    before = json.dumps([nccl, gloo], sort_keys=True)
    merged = recorders.merge(nccl, gloo)
    assert json.dumps([nccl, gloo], sort_keys=True) == before
    assert set(merged["pg_status"]) == {"0", "0:cpu"}
    assert set(merged["pg_config"]) == {"0", "5:cpu"}
    assert [e["process_group"][0] for e in merged["entries"]] == ["0", "0", "5:cpu"]
    assert collectives.names_in(merged) == {"0": "0", "0:cpu": "5:cpu"}
