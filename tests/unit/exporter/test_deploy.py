"""The shipped Prometheus alert rules and Grafana dashboard: promtool checks and unit
tests the rules; every rankguard series they name is one a live exporter serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from rankguard.exporter import MetricsExporter
from rankguard.goodput import Attempt, build_ledger, goodput_block
from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.layout import CHECKPOINTS_FILE
from rankguard.util.fs import atomic_write_json
from rankguard.view.runfiles import read_checkpoints
from tests.factories import FakeClock, heartbeat_config, heartbeat_record
from tests.factories import write_heartbeats as write

pytestmark = pytest.mark.timeout(60)

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
RULES = DEPLOY / "prometheus" / "rankguard-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "rankguard-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "rankguard-dashboard.json"
ALERTS = {
    "RankguardRankHung",
    "RankguardRankDead",
    "RankguardStraggler",
    "RankguardMFUDrop",
    "RankguardRestartLoop",
    "RankguardCheckpointTooOld",
    "RankguardLowETTR",
    "RankguardMonitorFailing",
    "RankguardNoStandbyLeft",
}
NAME = re.compile(r"\brankguard_[a-z0-9_]+\b")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian's `prometheus` package; CI installs it)",
)


def _promtool(*args: str) -> str:
    assert PROMTOOL is not None
    res = subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets") or []]
    queries += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    return queries


@needs_promtool
def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    assert "SUCCESS: 9 rules found" in _promtool("check", "rules", RULES.name)
    assert "SUCCESS" in _promtool("test", "rules", RULE_TESTS.name)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    assert {r["alert"] for r in _rules()} == ALERTS
    doc = yaml.safe_load(RULE_TESTS.read_text())
    cases = [c for t in doc["tests"] for c in t["alert_rule_test"]]
    for alert in ALERTS:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no firing case"
        assert any(not c["exp_alerts"] for c in mine), f"{alert}: no quiet case"


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, its Grafana variables filled in, as a recording rule that
    ``promtool check rules`` parses."""
    rules = []
    for i, query in enumerate(_dashboard_queries()):
        expr = query.replace("$__rate_interval", "5m").replace("$run_id", "r1")
        if expr.startswith("label_values("):
            expr = expr[len("label_values(") :].split(",")[0]
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    res = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_joins_dcgm_on_the_gpu_labels() -> None:
    queries = _dashboard_queries()
    dcgm = [q for q in queries if "DCGM_FI_DEV_GPU_UTIL" in q]
    assert dcgm and all("on (UUID)" in q and "rankguard_rank_info" in q for q in dcgm)


rec = partial(
    heartbeat_record, run_id="run-deploy", seq_step_ns=10**9, hostname="gpu-node", pid_base=7000
)


def _live_names(run_dir: Path) -> set[str]:
    """Sample names a real exporter serves over a job with every kind of data: perf
    windows with MFU, a rank gone silent (active findings), restarts, a committed
    checkpoint (rank 0's ``checkpoints.json``), straggler scores, a node's GPU health,
    a rank a standby replaced (live recovery)."""
    clock = FakeClock()
    mon = JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        "run-deploy",
        expected_world_size=2,
        clock=clock,
        check_pids=False,
    )
    atomic_write_json(
        run_dir / CHECKPOINTS_FILE,
        {
            "last_committed": {"persistent": 10, "local": None},
            "last": {"persistent": {"step": 10, "time": "2026-12-01T00:00:00+00:00"}},
            "failures": 0,
        },
    )

    job = Attempt(start=0.0, end=60.0, steps=[(1, 10.0), (50, 55.0)])

    class Launcher:  # the fields the launcher's services add to the status
        def status_fields(self) -> dict[str, Any]:
            return {
                "restarts": [{"kind": "process", "restart": 1}],
                "checkpoints": read_checkpoints(run_dir),
                "stragglers": {"scores": {"0": {"relative": 1.0, "individual": 1.0}}},
                "goodput": goodput_block(build_ledger([job]), final=False),
                "live": {
                    "standbys_per_node": 1,
                    "waiting": 0,
                    "used": 1,
                    "started": 0,
                    "replaced": [
                        {
                            "lost_rank": 1,
                            "cause": "rank_process_exited",
                            "recovery_s": 0.6,
                            "steps_redone": 0,
                        }
                    ],
                },
            }

    mon.add_status_source(Launcher())
    (run_dir / "gpu_health_node_0.json").write_text(
        json.dumps({"status": "ok", "source": "nvml", "hostname": "gpu-node", "gpus": []})
    )
    perf = {
        "step": 5,
        "iteration": 5,
        "step_time_ms": 200.0,
        "TFLOPS_per_GPU": 300.0,
        "MFU": 0.3,
        "memory_GB": 50.0,
        "windows": [[5, 5, 200.0]],
    }
    write(run_dir, rec(0, 0, progress_seq=5, perf=perf), rec(1, 0, progress_seq=5, perf=perf))
    mon.scan_once()
    for seq in range(1, 13):  # rank 1 goes silent: a finding, active
        clock.t += 1
        write(run_dir, rec(0, seq, progress_seq=5 + seq, perf=perf))
        mon.scan_once()
    exp = MetricsExporter(mon)
    exp.attach()
    exp.start("127.0.0.1", 0)
    try:
        assert exp.url is not None
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(exp.url, timeout=5) as resp:
            text = resp.read().decode()
    finally:
        exp.stop()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_series_the_rules_and_dashboard_name_is_served(tmp_path: Path) -> None:
    served = _live_names(tmp_path)
    referenced = {n for r in _rules() for n in NAME.findall(r["expr"])}
    referenced |= {n for q in _dashboard_queries() for n in NAME.findall(q)}
    assert len(referenced) > 20
    missing = sorted(referenced - served)
    assert not missing, f"not served by the exporter: {missing}"
