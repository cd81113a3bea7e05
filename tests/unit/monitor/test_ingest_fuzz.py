"""Property-based fuzzing of every path that reads data someone else may have written.

Heartbeat lines (a rank's file, read by the tailer and the rules), relay payloads in the
store (a node's records, ticks, health, kill and preemption requests), checkpoint
manifests, and the files ``rankguard status`` and ``rankguard report`` read. For each
generated input: no exception escapes the reader (only its own documented error), and
time and memory stay bounded (both asserted per input). Examples are few and each has a
deadline, so the module runs in seconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rankguard.checkpoint.files import (
    COMMIT_MARKER,
    MANIFEST_FILE,
    CheckpointError,
    checksum_bytes,
    read_manifest,
    verify_files,
)
from rankguard.cli.status_render import render_status
from rankguard.preempt import PreemptionConfig
from rankguard.preempt.coordinator import PreemptionCoordinator
from rankguard.relay.relay import StoreRemoteSource
from rankguard.report.data import ReportUnavailable, load_run
from rankguard.report.page import render_page
from rankguard.schema.layout import FINDINGS_FILE, STATUS_FILE, StoreKeys
from rankguard.schema.payloads import PayloadError, parse_kill_request
from rankguard.util.tailer import JsonlTailer
from rankguard.view.runfiles import StatusUnavailable, latest_findings, load_status
from tests.factories import DictStore, heartbeat_record, heartbeat_rules
from tests.fuzzing import bounded, dumps, json_values, nasty_text

RUN = "run-1"
KEYS = StoreKeys(RUN)
FUZZ = settings(
    max_examples=30,
    deadline=None,  # the bound is asserted by bounded() (a deadline would flake on load)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a failure shows as found
)

# -- inputs ---------------------------------------------------------------------------


def _record_like() -> st.SearchStrategy[dict[str, Any]]:
    """A well-formed heartbeat record with some fields replaced by anything."""
    base = heartbeat_record(0, run_id=RUN, world_size=4)
    keys = st.sampled_from([*sorted(base), "gpu", "exit", "rerun", "inprocess", "world_size"])
    return st.dictionaries(keys, json_values, max_size=6).map(lambda over: {**base, **over})


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


payload_text = st.one_of(json_values.map(dumps), nasty_text, _record_like().map(dumps))


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rankguard-fuzz-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _fresh(scratch: Path, name: str) -> Path:
    d = scratch / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


# -- heartbeat lines ------------------------------------------------------------------


@FUZZ
@given(lines=st.lists(st.one_of(payload_text, st.binary(max_size=64).map(repr)), max_size=6))
def test_heartbeat_lines(scratch: Path, lines: list[str]) -> None:
    path = _fresh(scratch, "hb") / "rank_0_pid_1.heartbeat.jsonl"
    good = dumps(heartbeat_record(1, run_id=RUN, world_size=4))
    path.write_text("\n".join([*lines, good]) + "\n", encoding="utf-8", errors="surrogatepass")
    rules = heartbeat_rules(world=None, max_world_size=64)
    with bounded("heartbeat lines"):
        records = JsonlTailer(path).read()
        for raw in records:
            rules.ingest(raw, 1.0)
        rules.evaluate(100.0)
    assert 1 in rules.ranks  # the good line after the bad ones still counts


@FUZZ
@given(record=_record_like())
def test_heartbeat_records(record: dict[str, Any]) -> None:
    rules = heartbeat_rules(world=None)
    with bounded("heartbeat record"):
        rules.ingest(record, 1.0)
        rules.evaluate(1000.0)


# -- relay payloads -------------------------------------------------------------------


def _relay_value(records: list[Any], health: Any, extra: dict[str, Any]) -> str:
    return dumps({"epoch": "e", "gen": 1, "records": records, "health": health, **extra})


relay_bases = st.one_of(
    payload_text,
    st.builds(
        _relay_value,
        st.lists(st.one_of(_record_like(), json_values), max_size=4),
        json_values,
        st.dictionaries(st.sampled_from(["disk", "shutdown", "root_cause", "gen"]), json_values),
    ),
)
relay_ticks = st.one_of(
    payload_text,
    st.builds(
        lambda rows, seq: dumps({"epoch": "e", "gen": 1, "seq": seq, "ranks": rows}),
        st.lists(st.lists(json_values, max_size=13), max_size=4),
        json_values,
    ),
)


@FUZZ
@given(base=relay_bases, tick=relay_ticks, other=relay_bases)
def test_relay_payloads(base: str, tick: str, other: str) -> None:
    store = DictStore()  # a TCPStore holds bytes
    store.set(KEYS.tick(1), _bytes(tick))
    store.set(KEYS.heartbeats(1), _bytes(base))
    store.set(KEYS.tick(2), _bytes(tick))
    store.set(KEYS.heartbeats(2), _bytes(other))
    source = StoreRemoteSource(store, RUN, nnodes=3)
    rules = heartbeat_rules(world=None, max_world_size=64)
    with bounded("relay payloads"):
        for _ in range(2):
            records, health = source.fetch_changed()
            for raw in records:
                rules.accept(raw)
            assert all(isinstance(h, dict) for h in health.values())
        source.disks()
        source.root_causes()


@FUZZ
@given(raw=st.one_of(payload_text, st.lists(json_values, max_size=50).map(dumps)))
def test_kill_requests(raw: str) -> None:
    with bounded("kill request"):
        try:
            targets, _ = parse_kill_request(_bytes(raw))
        except PayloadError:
            return
    assert all(type(t.pid) is int and type(t.rank) is int for t in targets)


class _NoWorkers:
    def pids(self) -> dict[int, int | None]:
        return {}

    def owns(self, pid: int) -> bool:
        return False


@FUZZ
@given(request=st.one_of(payload_text, st.binary(max_size=40)), preempt=payload_text)
def test_preemption_keys(scratch: Path, request: str | bytes, preempt: str) -> None:
    store = DictStore()
    store.set(KEYS.preempt_request(1), request if isinstance(request, bytes) else _bytes(request))
    store.set(KEYS.preempt, _bytes(preempt))
    run_dir = _fresh(scratch, "pre")
    ranks = {0: SimpleNamespace(record=SimpleNamespace(node_rank=1, extra={}))}
    coords = [
        PreemptionCoordinator(
            PreemptionConfig(enable_exit_handler=True),
            node_rank=node,
            nnodes=2,
            run_id=RUN,
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


# -- checkpoint manifests -------------------------------------------------------------


@FUZZ
@given(
    manifest=st.one_of(
        json_values,
        st.dictionaries(
            st.sampled_from(["files", "checksum", "world_size", "step", "format"]),
            json_values,
        ),
        st.builds(
            lambda files: {"files": files},
            st.dictionaries(st.text(max_size=12), json_values, max_size=4),
        ),
    ),
    raw=st.one_of(st.none(), nasty_text),
)
def test_manifests(scratch: Path, manifest: Any, raw: str | None) -> None:
    step = _fresh(scratch, "ckpt") / "step_000000001"
    step.mkdir()
    data = (raw if raw is not None else dumps(manifest)).encode("utf-8", "surrogatepass")
    (step / MANIFEST_FILE).write_bytes(data)
    algo = manifest.get("checksum") if isinstance(manifest, dict) else None
    algo = algo if algo in ("crc32", "blake2b") else "crc32"
    (step / COMMIT_MARKER).write_text(dumps({"manifest_checksum": checksum_bytes(data, algo)}))
    with bounded("manifest"):
        try:
            got = read_manifest(step)
            verify_files(step, got, sorted(got.files))
        except CheckpointError:
            pass


# -- what rankguard status and report read --------------------------------------------


run_files = st.dictionaries(
    st.sampled_from(
        [
            STATUS_FILE,
            FINDINGS_FILE,
            "status_ranks.json",
            "launcher.json",
            "restarts.jsonl",
            "checkpoints.json",
            "gpu_health_node_0.json",
            "rank_0_pid_1.heartbeat.jsonl",
        ]
    ),
    st.one_of(payload_text, st.lists(payload_text, max_size=4).map("\n".join)),
    min_size=1,
)


def _run_dir(scratch: Path, files: dict[str, str]) -> Path:
    run_dir = _fresh(scratch, "logs") / "heartbeat" / RUN
    run_dir.mkdir(parents=True)
    for name, text in files.items():
        (run_dir / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    return run_dir


@FUZZ
@given(files=run_files)
def test_status_files(scratch: Path, files: dict[str, str]) -> None:
    run_dir = _run_dir(scratch, files)
    with bounded("rankguard status"):
        try:
            status = load_status(run_dir)
        except StatusUnavailable:
            return
        findings = latest_findings(run_dir, status, 20)
        render_status(status, findings, width=120, now=datetime.now(timezone.utc))


@FUZZ
@given(files=run_files)
def test_report_files(scratch: Path, files: dict[str, str]) -> None:
    run_dir = _run_dir(scratch, files)
    with bounded("rankguard report"):
        try:
            data, note = load_run(run_dir)
        except ReportUnavailable:  # said as such by the command (exit 2)
            return
        render_page(data, note=note)
    assert os.path.isdir(run_dir)
