"""Ranks as threads: node 0's Prometheus exporter (``perf.prometheus``, a node service)
serves the monitor's state on loopback while the job runs, and says it stopped with the
job. The same assertions as the end-to-end run it replaces."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness import RankContext, ThreadedJob
from tests.harness.job import busy

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(90)]


def _scrape(endpoint: Path, parser: Any) -> dict[str, Any]:
    """The metric families served now, or {} while the endpoint is not written yet."""
    if not endpoint.exists():
        return {}
    info = json.loads(endpoint.read_text())
    assert info["host"] == "127.0.0.1"
    text = urllib.request.urlopen(info["url"], timeout=5).read().decode()
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_metrics_are_scraped_over_loopback_during_a_run(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    job = ThreadedJob(
        tmp_path,
        2,
        sets=("perf.prometheus.enabled=true", "perf.prometheus.port=0", "perf.log_interval=5"),
        pg_timeout_s=15,
    )
    endpoint = job.run_dir / "metrics_endpoint.json"
    scraped: dict[str, Any] = {}

    def rank(ctx: RankContext) -> int:
        """Train until rank 0 saw a step time for both ranks (a minute at most); the
        ranks agree on the step to stop at through an all-reduce."""
        deadline = time.monotonic() + 60
        step = 0
        while True:
            step += 1
            with ctx.session.compute():
                busy(0.01)
            if ctx.rank == 0 and step % 10 == 0 and not scraped:
                families = _scrape(endpoint, parser)
                times = families.get("rankguard_rank_step_time_seconds")
                if times is not None and len(times.samples) == 2:
                    scraped.update(families)
            done = torch.tensor([1.0 if scraped or time.monotonic() > deadline else 0.0])
            ctx.all_reduce(done)
            ctx.session.step_end(step)
            if done.item() > 0:
                return step

    res = job.run(rank)
    res.values()
    assert scraped, "no per-rank step time was exported within 60 s"
    live = scraped["rankguard_rank_process_liveness"]
    alive = {s.labels["rank"] for s in live.samples if s.labels["state"] == "alive" and s.value}
    assert alive == {"0", "1"}
    step = scraped["rankguard_rank_step_time_seconds"]
    assert all(0.001 < s.value < 10 for s in step.samples)  # seconds, not ms
    assert scraped["rankguard_findings"].type == "counter"  # exposed as *_total
    assert json.loads(endpoint.read_text())["active"] is False  # stopped with the job
