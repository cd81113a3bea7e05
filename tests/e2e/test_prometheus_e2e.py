"""The launcher serves Prometheus metrics on loopback while the job runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import rankguard_cmd, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_metrics_are_scraped_over_loopback_during_a_run(tmp_path: Path, run_id: str) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    proc = subprocess.Popen(
        rankguard_cmd(
            *standalone_run(run_id, tmp_path),
            "--set",
            "perf.prometheus.enabled=true",
            "--set",
            "perf.prometheus.port=0",
            "--set",
            "perf.log_interval=5",
            "-m",
            "rankguard.demo.train",
            "--steps",
            "100000",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    endpoint = tmp_path / "heartbeat" / run_id / "metrics_endpoint.json"
    try:
        families: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if not endpoint.exists():
                continue
            info = json.loads(endpoint.read_text())
            assert info["host"] == "127.0.0.1"
            text = urllib.request.urlopen(info["url"], timeout=5).read().decode()
            families = {f.name: f for f in parser.text_string_to_metric_families(text)}
            step = families.get("rankguard_rank_step_time_seconds")
            if step is not None and len(step.samples) == 2:
                break
        else:
            pytest.fail("no per-rank step time was exported within 60 s")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    live = families["rankguard_rank_process_liveness"]
    alive = {s.labels["rank"] for s in live.samples if s.labels["state"] == "alive" and s.value}
    assert alive == {"0", "1"}, out
    step = families["rankguard_rank_step_time_seconds"]
    assert all(0.001 < s.value < 10 for s in step.samples)  # seconds, not ms
    assert families["rankguard_findings"].type == "counter"  # exposed as *_total
    assert json.loads(endpoint.read_text())["active"] is False  # stopped with the job
