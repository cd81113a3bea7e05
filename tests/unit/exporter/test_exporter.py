"""Prometheus exporter: a real JobMonitor over heartbeat files, scraped over loopback HTTP."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from rankguard.exporter import ENDPOINT_FILE, MetricsExporter, start_for_monitor
from rankguard.exporter.collector import JOB_STATES, METRICS
from rankguard.monitor.monitor import JobMonitor
from rankguard.perf.config import PrometheusConfig
from tests.factories import FakeClock, heartbeat_config, heartbeat_record
from tests.factories import write_heartbeats as write

RUN = "run-prom"
NAME_RE = re.compile(r"^rankguard_[a-z0-9_]+$")
ALLOWED_LABELS = {"rank", "node_rank", "local_rank", "state", "stat", "status"}
ALLOWED_LABELS |= {"finding_type", "kind", "tier", "run_id", "part"}  # part: the ledger's 10
ALLOWED_LABELS |= {"Hostname", "gpu", "UUID", "modelName"}  # dcgm-exporter's names
LIVENESS = ("not_observed", "alive", "stale", "exited")
PROGRESS = ("not_observed", "starting", "progressing", "stalled", "unknown", "completed")

pytestmark = pytest.mark.timeout(60)


rec = partial(
    heartbeat_record,
    run_id=RUN,
    seq_step_ns=1_000_000_000,
    hostname="node-a",
    pid_base=4000,
    since=0.25,
    gpu_token=None,
    publisher_fields=True,
)


def perf(step: int, ms: float, tflops: float | None, mem_gb: float) -> dict[str, Any]:
    return {
        "step": step,
        "iteration": step,
        "step_time_ms": ms,
        "TFLOPS_per_GPU": tflops,
        "memory_GB": mem_gb,
        "windows": [[step, step, ms]],
    }


def _monitor(run_dir: Path, clock: FakeClock, world: int = 2) -> JobMonitor:
    return JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        RUN,
        expected_world_size=world,
        clock=clock,
        check_pids=False,
    )


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


def scrape(url: str) -> dict[str, Any]:
    """Families by name (counters by their ``_total`` sample name too)."""
    with _OPENER.open(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode("utf-8")
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam
        if fam.type == "counter":
            families[fam.name + "_total"] = fam
    return families


def value(families: dict[str, Any], name: str, **labels: str) -> float | None:
    """The one sample of ``name`` with these labels (and whatever else it carries:
    ``run_id``, the GPU's labels); more than one match fails."""
    fam = families.get(name)
    if fam is None:
        return None
    hits = [s.value for s in fam.samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def samples(families: dict[str, Any], name: str) -> list[Any]:
    fam = families.get(name)
    return [] if fam is None else [s for s in fam.samples if s.name == name]


@pytest.fixture
def exporters() -> Iterator[list[MetricsExporter]]:
    made: list[MetricsExporter] = []
    yield made
    for e in made:
        e.stop()


def _enabled(port: int = 0) -> PrometheusConfig:
    return PrometheusConfig(enabled=True, port=port)


def _running_job(tmp_path: Path, clock: FakeClock) -> JobMonitor:
    mon = _monitor(tmp_path, clock)
    write(
        tmp_path,
        rec(0, 0, progress_seq=7, perf=perf(7, 123.4, 55.5, 3.25)),
        rec(1, 0, progress_seq=7, since=0.5, perf=perf(7, 130.0, 50.0, 4.0)),
    )
    mon.scan_once()
    return mon


# ---- scraping -----------------------------------------------------------------------


def test_scrape_names_types_labels_and_values(
    tmp_path: Path, exporters: list[MetricsExporter]
) -> None:
    clock = FakeClock()
    mon = _running_job(tmp_path, clock)
    exp = start_for_monitor(mon, _enabled(), tmp_path)
    assert exp is not None
    exporters.append(exp)
    assert exp.url is not None and exp.url.startswith("http://127.0.0.1:")
    fams = scrape(exp.url)

    # Conventions: prefix, charset, _total on counters, HELP on every family, bounded labels.
    for fam in fams.values():
        assert NAME_RE.match(fam.name), fam.name
        assert fam.type in ("gauge", "counter"), (fam.name, fam.type)
        assert fam.documentation, fam.name
        for s in fam.samples:
            assert NAME_RE.match(s.name), s.name
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            if fam.type == "counter":
                assert s.name.endswith("_total"), s.name
    types = {fam.name: fam.type for fam in fams.values()}
    for name in (
        "rankguard_rank_step_time_seconds",
        "rankguard_rank_flops_per_second",
        "rankguard_rank_memory_bytes",
        "rankguard_rank_iteration",
        "rankguard_rank_heartbeat_age_seconds",
        "rankguard_rank_progress_age_seconds",
        "rankguard_rank_process_liveness",
        "rankguard_rank_gpu_progress",
        "rankguard_job_step_time_seconds",
        "rankguard_job_state",
        "rankguard_monitor_scan_seconds",
    ):
        assert types[name] == "gauge", name
    for name in ("rankguard_findings", "rankguard_monitor_scans", "rankguard_rank_steps"):
        assert types[name] == "counter", name

    # Base units: ms -> s, TFLOP/s -> FLOP/s, GB -> bytes.
    assert value(fams, "rankguard_rank_step_time_seconds", rank="0") == pytest.approx(0.1234)
    assert value(fams, "rankguard_rank_step_time_seconds", rank="1") == pytest.approx(0.130)
    assert value(fams, "rankguard_rank_flops_per_second", rank="0") == pytest.approx(55.5e12)
    assert value(fams, "rankguard_rank_flops_per_second", rank="1") == pytest.approx(50e12)
    assert value(fams, "rankguard_rank_memory_bytes", rank="0") == pytest.approx(3.25e9)
    assert value(fams, "rankguard_rank_memory_bytes", rank="1") == pytest.approx(4e9)
    assert value(fams, "rankguard_rank_iteration", rank="1") == 7
    assert value(fams, "rankguard_rank_steps_total", rank="0") == 7
    assert value(fams, "rankguard_rank_heartbeat_age_seconds", rank="0") == 0.0
    assert value(fams, "rankguard_rank_progress_age_seconds", rank="1") == pytest.approx(0.5)
    assert value(fams, "rankguard_rank_checkpoint_active", rank="0") == 0.0
    assert value(fams, "rankguard_rank_active_findings", rank="0") == 0.0
    assert (
        value(
            fams, "rankguard_rank_info", rank="1", node_rank="0", local_rank="1", Hostname="node-a"
        )
        == 1.0
    )

    # One-hot states: exactly one 1 per rank, every state present.
    for name, states, current in (
        ("rankguard_rank_process_liveness", LIVENESS, "alive"),
        ("rankguard_rank_gpu_progress", PROGRESS, "progressing"),
    ):
        for rank in ("0", "1"):
            got = {
                s.labels["state"]: s.value for s in samples(fams, name) if s.labels["rank"] == rank
            }
            assert got == {s: float(s == current) for s in states}, (name, rank, got)
    assert {s.labels["state"]: s.value for s in samples(fams, "rankguard_job_state")} == {
        s: float(s == "running") for s in JOB_STATES
    }
    assert value(fams, "rankguard_job_ranks_process_liveness", state="alive") == 2
    assert value(fams, "rankguard_job_ranks_process_liveness", state="stale") == 0
    assert value(fams, "rankguard_job_ranks_expected") == 2
    assert value(fams, "rankguard_job_ranks_observed") == 2

    # Cross-rank step times (perf_ranks) in seconds.
    assert value(fams, "rankguard_job_step_time_seconds", stat="min") == pytest.approx(0.1234)
    assert value(fams, "rankguard_job_step_time_seconds", stat="median") == pytest.approx(0.1267)
    assert value(fams, "rankguard_job_step_time_seconds", stat="max") == pytest.approx(0.130)
    assert value(fams, "rankguard_job_perf_iteration") == 7

    # The monitor itself.
    assert value(fams, "rankguard_monitor_scans_total") == 1
    assert value(fams, "rankguard_monitor_scan_errors_total") == 0
    assert value(fams, "rankguard_monitor_scan_seconds") == pytest.approx(mon.last_scan_s)
    age = value(fams, "rankguard_monitor_status_age_seconds")
    assert age is not None and 0 <= age < 30
    assert value(fams, "rankguard_findings_total", finding_type="gpu_progress_timeout") == 0

    # Read at scrape time: the next scan shows without any push.
    mon.scan_once()
    assert value(scrape(exp.url), "rankguard_monitor_scans_total") == 2


def test_missing_values_are_absent_not_zero(
    tmp_path: Path, exporters: list[MetricsExporter]
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, world=3)
    write(
        tmp_path,
        rec(0, 0, perf=perf(1, 10.0, None, 1.0), world_size=3),  # no FLOPs configured
        rec(1, 0, world_size=3),  # no perf window yet
    )  # rank 2 never seen
    mon.scan_once()
    exp = MetricsExporter(mon)
    exporters.append(exp)
    exp.start("127.0.0.1", 0)
    assert exp.url is not None
    fams = scrape(exp.url)
    assert value(fams, "rankguard_rank_step_time_seconds", rank="0") == pytest.approx(0.01)
    assert value(fams, "rankguard_rank_flops_per_second", rank="0") is None
    assert value(fams, "rankguard_rank_step_time_seconds", rank="1") is None
    assert value(fams, "rankguard_rank_heartbeat_age_seconds", rank="2") is None
    assert {s.labels["rank"] for s in samples(fams, "rankguard_rank_info")} == {"0", "1"}
    assert value(fams, "rankguard_rank_process_liveness", rank="2", state="not_observed") == 1
    # No window every rank reported: no cross-rank step time.
    assert samples(fams, "rankguard_job_step_time_seconds") == []


def test_findings_counted_by_type_through_the_monitor_callback(
    tmp_path: Path, exporters: list[MetricsExporter]
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    exp = start_for_monitor(mon, _enabled(), tmp_path)  # before the first scan
    assert exp is not None and exp.url is not None
    exporters.append(exp)
    exp.attach()  # idempotent: registered once
    assert mon.sinks.count(exp.counter) == 1
    write(tmp_path, rec(0, 0), rec(1, 0))
    mon.scan_once()
    for seq in range(1, 13):  # rank 1 goes silent
        clock.t += 1
        write(tmp_path, rec(0, seq, progress_seq=seq))
        mon.scan_once()
    fams = scrape(exp.url)
    assert (
        value(fams, "rankguard_findings_total", finding_type="rank_process_heartbeat_timeout") == 1
    )
    assert value(fams, "rankguard_findings_total", finding_type="gpu_progress_timeout") == 0
    assert value(fams, "rankguard_findings_active") == 1
    assert value(fams, "rankguard_rank_process_liveness", rank="1", state="stale") == 1
    assert value(fams, "rankguard_rank_process_liveness", rank="1", state="alive") == 0
    assert value(fams, "rankguard_rank_gpu_progress", rank="1", state="unknown") == 1
    assert value(fams, "rankguard_rank_active_findings", rank="1") == 1
    assert value(fams, "rankguard_job_state", state="degraded") == 1
    # The counter is the exporter's own: it outlives the monitor's 20 recent findings.
    for _ in range(25):
        exp.observe_finding({"finding_type": "gpu_progress_timeout"})
    fams = scrape(exp.url)
    assert value(fams, "rankguard_findings_total", finding_type="gpu_progress_timeout") == 25
    assert len(mon.recent_findings) == 1


def test_gpu_health_per_node_is_one_hot(tmp_path: Path, exporters: list[MetricsExporter]) -> None:
    clock = FakeClock()
    mon = _running_job(tmp_path, clock)
    (tmp_path / "gpu_health_node_0.json").write_text(
        json.dumps({"status": "warning", "source": "nvml", "hostname": "node-a", "gpus": []})
    )
    mon.scan_once()
    exp = MetricsExporter(mon)
    exporters.append(exp)
    fams = {f.name: f for f in text_string_to_metric_families(exp.render().decode())}
    got = {s.labels["status"]: s.value for s in samples(fams, "rankguard_node_gpu_health")}
    assert got == {"ok": 0, "warning": 1, "unhealthy": 0, "unavailable": 0, "error": 0}
    assert value(fams, "rankguard_node_gpu_health_age_seconds", node_rank="0") == 0


def test_before_the_first_scan_only_monitor_metrics(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, FakeClock())
    exp = MetricsExporter(mon)
    names = {f.name for f in text_string_to_metric_families(exp.render().decode())}
    assert names == {
        "rankguard_findings",
        "rankguard_monitor_scans",
        "rankguard_monitor_scan_errors",
        "rankguard_monitor_scan_seconds",
    }


def test_catalogue_follows_the_conventions(tmp_path: Path) -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    for m in METRICS:
        assert NAME_RE.match(m.name), m.name
        assert m.kind in ("gauge", "counter")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert m.help and (m.help[0].isupper() or m.help[0].isdigit()), m.name
        assert set(m.labels) <= ALLOWED_LABELS, (m.name, m.labels)
        assert "pid" not in m.labels and "step" not in m.labels and "iteration" not in m.labels
    # No TFLOP/s, ms or GB: base units only.
    assert not [n for n in names if re.search(r"tflops|_ms$|_gb$|milli", n)]
    # Registered in its own registry, not the process-global one.
    from prometheus_client import REGISTRY

    exp = MetricsExporter(_monitor(tmp_path, FakeClock()))
    assert exp.registry is not REGISTRY
    assert "rankguard_rank_step_time_seconds" not in REGISTRY._names_to_collectors
    assert "rankguard_rank_step_time_seconds" in exp.registry._names_to_collectors
    MetricsExporter(_monitor(tmp_path, FakeClock()))  # a second one does not clash


# ---- lifecycle ----------------------------------------------------------------------


def test_endpoint_file_and_loopback_default(
    tmp_path: Path, exporters: list[MetricsExporter]
) -> None:
    assert PrometheusConfig().host == "127.0.0.1" and PrometheusConfig().port == 9464
    mon = _running_job(tmp_path, FakeClock())
    exp = start_for_monitor(mon, PrometheusConfig(enabled=True, port=0), tmp_path / "out")
    assert exp is not None
    exporters.append(exp)
    assert exp._server is not None
    assert exp._server.socket.getsockname()[0] == "127.0.0.1"
    assert exp.port is not None and exp.port > 0
    endpoint = json.loads((tmp_path / "out" / ENDPOINT_FILE).read_text())
    assert endpoint["active"] is True
    assert endpoint["host"] == "127.0.0.1"
    assert endpoint["port"] == exp.port
    assert endpoint["url"] == f"http://127.0.0.1:{exp.port}/metrics" == exp.url
    assert endpoint["run_id"] == RUN
    assert endpoint["stopped_wall_time"] is None
    assert list((tmp_path / "out").glob(".*.tmp")) == []
    # MetricsExporter.start's own default host is loopback too.
    other = MetricsExporter(mon, run_dir=tmp_path / "other")
    exporters.append(other)
    other.start(port=0)
    assert other.host == "127.0.0.1"


def test_disabled_config_starts_nothing(tmp_path: Path) -> None:
    mon = _monitor(tmp_path, FakeClock())
    before = {t.ident for t in threading.enumerate()}
    assert start_for_monitor(mon, PrometheusConfig(), tmp_path) is None
    assert not (tmp_path / ENDPOINT_FILE).exists()
    assert mon.sinks == ()
    assert {t.ident for t in threading.enumerate()} == before


def test_disabled_does_not_import_prometheus_client(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from rankguard.exporter import start_for_monitor\n"
        "from rankguard.perf.config import PrometheusConfig\n"
        "assert start_for_monitor(object(), PrometheusConfig(), Path('.')) is None\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_stop_frees_the_port_and_is_idempotent(
    tmp_path: Path, exporters: list[MetricsExporter]
) -> None:
    mon = _running_job(tmp_path, FakeClock())
    exp = MetricsExporter(mon)
    exporters.append(exp)
    port = exp.start("127.0.0.1", 0)
    url = exp.url
    assert url is not None
    scrape(url)
    thread = exp._thread
    assert thread is not None and thread.is_alive()
    exp.stop()
    exp.stop()
    assert not thread.is_alive()
    assert exp.url is None
    with pytest.raises(urllib.error.URLError):
        _OPENER.open(url, timeout=2)
    endpoint = json.loads((tmp_path / ENDPOINT_FILE).read_text())
    assert endpoint["active"] is False and endpoint["stopped_wall_time"]
    # The same port can be served again at once.
    again = MetricsExporter(mon)
    exporters.append(again)
    assert again.start("127.0.0.1", port) == port
    assert value(scrape(f"http://127.0.0.1:{port}/metrics"), "rankguard_monitor_scans_total") == 1


def test_start_twice_raises(tmp_path: Path, exporters: list[MetricsExporter]) -> None:
    exp = MetricsExporter(_monitor(tmp_path, FakeClock()))
    exporters.append(exp)
    exp.start("127.0.0.1", 0)
    with pytest.raises(RuntimeError, match="already serving"):
        exp.start("127.0.0.1", 0)


def test_port_in_use_warns_and_returns_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mon = _monitor(tmp_path, FakeClock())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="rankguard.exporter.prometheus"):
            assert start_for_monitor(mon, _enabled(port), tmp_path) is None
    assert "NOT active" in caplog.text and str(port) in caplog.text
    assert mon.sinks == ()
    assert not (tmp_path / ENDPOINT_FILE).exists()


def test_straggler_scores_are_exported_per_rank() -> None:
    from rankguard.exporter.collector import build_families

    status = {
        "stragglers": {
            "scores": {
                "0": {"relative": 1.0, "individual": 0.98},
                "1": {"relative": 0.66, "individual": 1.0},
            }
        },
    }
    families = {
        f.name: f
        for f in build_families(
            status, scans=1, scan_errors=0, last_scan_s=0.0, finding_counts={}, now_wall=0.0
        )
    }
    rel = {
        s.labels["rank"]: s.value
        for s in families["rankguard_rank_straggler_relative_score"].samples
    }
    ind = {
        s.labels["rank"]: s.value
        for s in families["rankguard_rank_straggler_individual_score"].samples
    }
    assert rel == {"0": 1.0, "1": 0.66} and ind == {"0": 0.98, "1": 1.0}


# ---- joining DCGM ---------------------------------------------------------------------


def _families(status: dict[str, Any], **kw: Any) -> dict[str, Any]:
    from rankguard.exporter.collector import build_families

    args: dict[str, Any] = dict(
        scans=1, scan_errors=0, last_scan_s=0.0, finding_counts={}, now_wall=1000.0
    )
    args.update(kw)
    fams = {}
    for f in build_families(status, **args):
        fams[f.name] = fams[f.name + "_total" if f.type == "counter" else f.name] = f
    return fams


def _gpu_row(rank: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rank": rank,
        "pid": 100 + rank,
        "hostname": "gpu-node-7",
        "node_rank": 0,
        "local_rank": rank,
        "process_liveness": "alive",
        "gpu_progress": "progressing",
        "perf": {"step_time_ms": 250.0, "TFLOPS_per_GPU": 400.0, "MFU": 0.41, "memory_GB": 60},
        "gpu": {"ordinal": 0, "token": str(rank + 2), "uuid": None},
        "gpu_health": {"index": rank + 2, "uuid": f"GPU-aaaa-{rank}", "name": "NVIDIA H200"},
        "active_findings": [],
    }
    row.update(over)
    return row


def test_per_rank_series_carry_dcgm_exporters_gpu_labels() -> None:
    status = {
        "run_id": "job-42",
        "state": "running",
        "ranks": [
            _gpu_row(0),
            # health not matched yet: only what the rank knows (a GPU- token is a UUID)
            _gpu_row(1, gpu={"ordinal": 0, "token": "GPU-bbbb-1"}, gpu_health=None),
            # a bare CUDA ordinal is no NVML index: no gpu label rather than a wrong one
            _gpu_row(2, gpu={"ordinal": 3, "token": None}, gpu_health=None),
        ],
    }
    fams = _families(status)
    for fam in fams.values():
        for s in fam.samples:
            assert s.labels["run_id"] == "job-42", (fam.name, s.labels)
    by_rank = {s.labels["rank"]: s.labels for s in fams["rankguard_rank_step_time_seconds"].samples}
    assert by_rank["0"] == {
        "run_id": "job-42",
        "rank": "0",
        "Hostname": "gpu-node-7",
        "gpu": "2",
        "UUID": "GPU-aaaa-0",
        "modelName": "NVIDIA H200",
    }
    assert (by_rank["1"]["gpu"], by_rank["1"]["UUID"], by_rank["1"]["modelName"]) == (
        "",
        "GPU-bbbb-1",
        "",
    )
    assert (by_rank["2"]["gpu"], by_rank["2"]["UUID"]) == ("", "")
    assert value(fams, "rankguard_rank_mfu_ratio", rank="0", gpu="2") == pytest.approx(0.41)
    info = value(fams, "rankguard_rank_info", rank="0", UUID="GPU-aaaa-0", node_rank="0")
    assert info == 1.0


def test_restarts_checkpoints_findings_and_monitor_state_series() -> None:
    status = {
        "run_id": "job-42",
        "state": "degraded",
        "monitor": {"state": "failing"},
        "ranks": [_gpu_row(0, active_findings=["gpu_progress_timeout", "rank_straggler"])],
        "restarts": [{"kind": "process", "restart": 1}, {"kind": "process", "restart": 2}],
        "checkpoints": {
            "last_committed": {"persistent": 200, "local": None},
            "last": {"persistent": {"step": 200, "time": "1970-01-01T00:15:00+00:00"}},
            "failures": 1,
        },
    }
    fams = _families(status)
    assert value(fams, "rankguard_job_restarts_total", kind="process") == 2
    assert value(fams, "rankguard_job_restarts_total", kind="inprocess") == 0
    assert value(fams, "rankguard_checkpoint_last_step", tier="persistent") == 200
    assert value(fams, "rankguard_checkpoint_last_step", tier="local") is None
    assert value(fams, "rankguard_checkpoint_age_seconds", tier="persistent") == 100.0
    assert value(fams, "rankguard_checkpoint_failures_total") == 1
    active = {s.labels["finding_type"] for s in fams["rankguard_rank_finding_active"].samples}
    assert active == {"gpu_progress_timeout", "rank_straggler"}
    got = {s.labels["state"]: s.value for s in fams["rankguard_monitor_state"].samples}
    assert got == {"starting": 0, "scanning": 0, "failing": 1, "stopped": 0}


# ---- goodput --------------------------------------------------------------------------


def test_goodput_ettr_and_every_part_of_the_ledger(tmp_path: Path) -> None:
    from rankguard.goodput import PARTS, Attempt, build_ledger, goodput_block

    ledger = build_ledger(
        [
            Attempt(start=0.0, end=30.0, steps=[(1, 5.0), (20, 25.0)], failed=True, decision=27),
            Attempt(start=32.0, end=60.0, steps=[(21, 36.0), (40, 58.0)], resumed_from=20),
        ]
    )
    block = goodput_block(ledger, final=False).to_dict()
    status = {"run_id": "r", "state": "running", "goodput": block}
    fams = _families(status)
    assert fams["rankguard_goodput_ettr_ratio"].samples[0].value == pytest.approx(ledger.ettr)
    assert fams["rankguard_goodput_wall_seconds"].samples[0].value == 60.0
    parts = {s.labels["part"]: s.value for s in fams["rankguard_goodput_seconds"].samples}
    assert parts == {p.value: pytest.approx(ledger.parts[p], abs=1e-3) for p in PARTS}
    assert sum(parts.values()) == pytest.approx(60.0)
    assert parts["recovery"] == pytest.approx(5.0) and parts["startup"] == pytest.approx(9.0)
    no_block = _families({"run_id": "r", "state": "running"})
    assert not any(name.startswith("rankguard_goodput") for name in no_block)


# ---- live recovery ----------------------------------------------------------------------


def _replaced(rank: int, cause: str, cost: float | None, redone: int | None) -> dict[str, Any]:
    return {
        "lost_rank": rank,
        "lost_pid": 100 + rank,
        "standby_pid": 200 + rank,
        "cause": cause,
        "fault_t": 1000.0 + rank,
        "recovery_s": cost,
        "steps_redone": redone,
    }


def test_live_recovery_series_come_from_the_status_live_block() -> None:
    live = {
        "standbys_per_node": 1,
        "waiting": 0,
        "left_unused": 0,
        "used": 3,
        "started": 2,
        "replaced": [
            _replaced(2, "rank_process_exited", 0.6, 0),
            _replaced(1, "rank_process_heartbeat_timeout", 9.5, 1),
            # the newest: its newcomer has not completed a step yet (no cost)
            _replaced(3, "rank_process_exited", None, None),
        ],
    }
    fams = _families({"run_id": "r", "state": "running", "live": live})
    causes = {s.labels["finding_type"]: s.value for s in fams["rankguard_live_recoveries"].samples}
    assert causes == {"rank_process_exited": 2, "rank_process_heartbeat_timeout": 1}
    assert value(fams, "rankguard_live_last_recovery_seconds") == 9.5
    assert value(fams, "rankguard_live_recovery_seconds_total") == pytest.approx(10.1)
    assert value(fams, "rankguard_live_recoveries_resumed_total") == 2
    assert value(fams, "rankguard_live_steps_redone_total") == 1
    assert value(fams, "rankguard_live_standbys_configured") == 1
    assert value(fams, "rankguard_live_standbys_waiting") == 0  # present, not absent
    assert value(fams, "rankguard_live_standbys_used_total") == 3
    assert value(fams, "rankguard_live_standbys_started_total") == 2
    # standbys, no recovery yet: the standbys' series, no cost, no cause
    quiet = dict(live, waiting=1, used=0, started=0, replaced=[])
    fams = _families({"run_id": "r", "state": "running", "live": quiet})
    assert value(fams, "rankguard_live_standbys_waiting") == 1
    assert value(fams, "rankguard_live_last_recovery_seconds") is None
    assert "rankguard_live_recoveries" not in fams
    # no standbys (no live block): no live series at all
    no_block = _families({"run_id": "r", "state": "running"})
    assert not any(name.startswith("rankguard_live") for name in no_block)
