"""Property-based fuzzing of every store key a peer (or anyone who can reach the
rendezvous store) can write, read back by the real readers from a real ``TCPStore`` on
loopback: the spares' ``agents`` counter and ``agent/<i>`` entries, the exclusions'
``excluded_count`` and ``excluded/<i>``, the preemption keys, an in-process round's fault
reports, and a relay's records. For each generated input: no exception escapes the
reader, what it keeps is well formed, and time and memory stay bounded (both asserted per
input). Examples are few and derandomized, so the module runs in seconds."""

from __future__ import annotations

import itertools
import json
import socket
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.distributed import TCPStore

from rankguard.ft.config import FaultToleranceConfig
from rankguard.inprocess.policy import CAUSES, FaultReport, choose_culprit
from rankguard.launcher.exclusion import Exclusion, NodeExclusion, is_hostname
from rankguard.launcher.spares import (
    MAX_KEEPALIVE_S,
    SpareWatch,
    elastic_status,
    full_round_without,
    read_agents,
    waiting_agents,
)
from rankguard.preempt import PreemptionConfig
from rankguard.preempt.coordinator import PreemptionCoordinator
from rankguard.relay.relay import StoreRemoteSource
from rankguard.schema.layout import StoreKeys
from rankguard.schema.statusblocks import block_json
from tests.factories import heartbeat_record, heartbeat_rules
from tests.fuzzing import bounded, dumps, json_values, nasty_text

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=30,
    deadline=None,  # the bound is asserted by bounded() (a deadline would flake on load)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a failure shows as found
)
_runs = itertools.count()

# -- inputs ---------------------------------------------------------------------------

counters = st.one_of(st.integers(0, 8), st.integers(0, 2**62))


def _like(base: dict[str, Any], extra: list[str]) -> st.SearchStrategy[str]:
    """``base`` with some of its fields (or ``extra`` ones) replaced by anything."""
    keys = st.sampled_from([*sorted(base), *extra])
    return st.dictionaries(keys, json_values, max_size=4).map(lambda over: dumps({**base, **over}))


def _values(base: dict[str, Any], extra: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(json_values.map(dumps), nasty_text, _like(base, extra))


AGENT = {
    "agent": "h:1",
    "state": "waiting",
    "since": 1.0,
    "started": 1.0,
    "beat": 0,
    "rounds": 0,
    "keepalive_s": 5.0,
}
EXCLUSION = Exclusion("gpu_health", "bad-host", 42, 1, 0, ("xid=79",), "excluded").to_dict()
REPORT = {"rank": 1, "cause": "exception", "message": "m", "stuck_s": 0.0}


@pytest.fixture(scope="module")
def store() -> TCPStore:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )


def _put(store: TCPStore, key: str, text: str) -> None:
    store.set(key, text.encode("utf-8", "surrogatepass"))


def _run() -> str:
    return f"fz{next(_runs)}"


# -- spares ---------------------------------------------------------------------------


@FUZZ
@given(
    entries=st.lists(_values(AGENT, ["node", "nodes", "round", "joined", "waited_s"]), max_size=5),
    extra=counters,
)
def test_spare_entries(store: TCPStore, entries: list[str], extra: int) -> None:
    run = _run()
    for i, text in enumerate(entries):
        store.add(f"rankguard/{run}/agents", 1)
        _put(store, f"rankguard/{run}/agent/{i}", text)
    store.add(f"rankguard/{run}/agents", extra)  # a raised counter
    watch = SpareWatch()
    with bounded("spare entries"):
        agents = read_agents(store, run)
        for now in (0.0, 1e6):
            gone = watch.gone(agents, now)
        status = elastic_status(
            agents, round_tag="R", nodes=2, min_nodes=1, max_nodes=2, history=[], gone=gone
        )
        json.dumps(block_json(status), allow_nan=False)  # what status.json can hold
        full_round_without(agents, "h:1", 2)
        waiting_agents(store, run)
    for a in agents:
        assert isinstance(a["agent"], str) and a["state"] in ("waiting", "training", "left")
        assert 0 < a["keepalive_s"] <= MAX_KEEPALIVE_S


# -- exclusions -----------------------------------------------------------------------


@FUZZ
@given(entries=st.lists(_values(EXCLUSION, ["node"]), max_size=5), extra=counters)
def test_exclusion_entries(
    store: TCPStore, tmp_path_factory: Any, entries: list[str], extra: int
) -> None:
    run = _run()
    keys = StoreKeys(run)
    for text in entries:
        index = int(store.add(keys.excluded_count, 1))
        _put(store, keys.excluded(str(index)), text)
    store.add(keys.excluded_count, extra)
    run_dir = Path(tmp_path_factory.mktemp("excl"))
    node = NodeExclusion(
        FaultToleranceConfig(exclude_bad_nodes=True),
        run_id=run,
        run_dir=run_dir,
        min_nodes=1,
        max_nodes=4,
        store=store,
        say=lambda m: None,
        health=lambda: {"status": "ok", "gpus": []},
    )
    with bounded("exclusion entries"):
        node.sync(write_findings=True)
    for e in node.known.values():
        assert is_hostname(e.hostname) and type(e.pid) is int
        assert len(e.message) <= 1000 and len(e.problems) <= 16


# -- preemption -----------------------------------------------------------------------


class _NoWorkers:
    def pids(self) -> dict[int, int | None]:
        return {}

    def owns(self, pid: int) -> bool:
        return False


@FUZZ
@given(
    request=st.one_of(json_values.map(dumps), nasty_text),
    preempt=_values({"step": 5, "reason": "r"}, []),
)
def test_preemption_keys(
    store: TCPStore, tmp_path_factory: Any, request: str, preempt: str
) -> None:
    run = _run()
    keys = StoreKeys(run)
    _put(store, keys.preempt_request(1), request)
    _put(store, keys.preempt, preempt)
    run_dir = Path(tmp_path_factory.mktemp("pre"))
    ranks = {0: SimpleNamespace(record=SimpleNamespace(node_rank=1, extra={}))}
    coords = [
        PreemptionCoordinator(
            PreemptionConfig(enable_exit_handler=True),
            node_rank=node,
            nnodes=2,
            run_id=run,
            run_dir=run_dir,
            workers=_NoWorkers(),  # type: ignore[arg-type]
            store=store,
            ranks=lambda: ranks,
            say=lambda m: None,
        )
        for node in (0, 1)
    ]
    with bounded("preemption keys"):
        for coord in coords:
            coord.tick()
    assert not coords[0].active  # no rank of node 1 confirmed a signal


# -- an in-process round's fault reports ----------------------------------------------


@FUZZ
@given(reports=st.lists(_values(REPORT, ["hostname", "in_collective"]), max_size=4))
def test_inprocess_fault_reports(store: TCPStore, reports: list[str]) -> None:
    prefix = f"rankguard/inprocess/{_run()}/0/0/0/"
    for p, text in enumerate(reports):
        _put(store, f"{prefix}fault/{p}", text)
    got = []
    with bounded("fault reports"):
        for p in range(len(reports)):  # as the wrapper reads them after a round
            try:
                got.append(FaultReport.from_json(store.get(f"{prefix}fault/{p}")))
            except ValueError:
                continue
        choose_culprit(got, 1.0)
    for r in got:
        assert type(r.rank) is int and r.cause in CAUSES and len(r.message) <= 2000


# -- a relay's records ----------------------------------------------------------------


@FUZZ
@given(
    base=_values(
        {"epoch": "e", "gen": 1, "records": [heartbeat_record(4, world_size=8)], "health": {}},
        ["disk", "shutdown", "root_cause"],
    ),
    tick=_values({"epoch": "e", "gen": 1, "seq": 1, "ranks": []}, []),
)
def test_relay_keys(store: TCPStore, base: str, tick: str) -> None:
    run = _run()
    keys = StoreKeys(run)
    _put(store, keys.heartbeats(1), base)
    _put(store, keys.tick(1), tick)
    source = StoreRemoteSource(store, run, nnodes=2)
    rules = heartbeat_rules(world=None, max_world_size=64)
    with bounded("relay keys"):
        records, health = source.fetch_changed()
        for raw in records:
            rules.accept(raw)
        source.disks()
        source.root_causes()
    assert all(isinstance(h, dict) for h in health.values())
