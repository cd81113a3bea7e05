"""Prometheus metric families built from the job monitor's ``status.json`` at scrape time.

Why a custom collector and not ``Gauge``/``Counter`` objects updated by a thread: the
monitor already rebuilds one consistent status dict per scan and replaces it in one
assignment, so reading ``monitor.status`` when Prometheus scrapes gives a coherent view
with nothing to keep in sync, no second thread and no stale series for a rank that
vanished. Only the findings counter needs state of its own (the monitor keeps the last
20 findings), fed by :meth:`FindingCounts.observe`.

Naming follows the Prometheus conventions: the ``rankguard_`` prefix, base units
(seconds, bytes, FLOP/s, ratios 0-1), ``_total`` on counters, one-hot state gauges (1 for
the current state, 0 for the others, every state always present so that absent and zero
are never confused) and bounded labels only. Every series carries ``run_id``; every
per-rank series also carries the labels dcgm-exporter gives the rank's GPU
(:data:`DCGM_LABELS`: ``Hostname``, ``gpu`` (the NVML index), ``UUID``, ``modelName``;
empty where the GPU is not known, e.g. on CPU), so a PromQL join or a Grafana panel puts
``DCGM_FI_DEV_*`` next to a rank's progress with ``on(Hostname, gpu)`` or ``on(UUID)``.
No pid, step or iteration ever becomes a label. :data:`METRICS` is the catalogue (name,
type, help, labels); ``describe()`` returns it so a name clash fails at registration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rankguard.exporter.live import LIVE_METRICS, live_series
from rankguard.goodput.ledger import PARTS
from rankguard.health.schema import NodeStatus
from rankguard.schema.coerce import as_float
from rankguard.schema.findings import Finding, FindingType, Liveness, Progress
from rankguard.schema.jsontypes import JsonInput, JsonObject
from rankguard.schema.restarts import LiveBlock, RestartsBlock
from rankguard.schema.status import RankGpu, RankGpuHealth, RankRow, StatusDoc
from rankguard.schema.statusblocks import CheckpointsBlock, GoodputBlock, StragglersBlock
from rankguard.view.runfiles import worst_rows

if TYPE_CHECKING:
    from rankguard.monitor.monitor import JobMonitor

__all__ = [
    "DCGM_LABELS",
    "JOB_STATES",
    "METRICS",
    "MONITOR_STATES",
    "FindingCounts",
    "MetricSpec",
    "StatusCollector",
    "rank_labels",
]

#: Every value of ``status.json``'s ``state`` (see ``JobMonitor._build_status``).
JOB_STATES = ("starting", "running", "degraded", "completed", "failed", "stopped")
#: Every value of ``status.json``'s ``monitor.state`` (see ``JobMonitor``).
MONITOR_STATES = ("starting", "scanning", "failing", "stopped")
#: dcgm-exporter's label names for a GPU, in the order every per-rank series has them.
DCGM_LABELS = ("Hostname", "gpu", "UUID", "modelName")
_LIVENESS = tuple(s.value for s in Liveness)
_PROGRESS = tuple(s.value for s in Progress)
_NODE_STATUS = tuple(s.value for s in NodeStatus)
_STATS = ("min", "median", "max")
_Family = CounterMetricFamily | GaugeMetricFamily
_MS = 1e-3
_TFLOPS = 1e12
_GB = 1e9  # rankguard.perf.memory reports decimal GB


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: name, Prometheus type, HELP text and label names."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> _Family:
        """An empty family of this spec, ready for ``add_metric``."""
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.labels)
        assert self.kind == "gauge", self.kind
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


_RUN = ("run_id",)
_R = ("run_id", "rank", *DCGM_LABELS)
METRICS: tuple[MetricSpec, ...] = (
    # ---- per rank: straggler scores (straggler.enabled) ----
    MetricSpec(
        "rankguard_rank_straggler_relative_score",
        "gauge",
        "Best rank's compute time / this rank's, at the last straggler report (ratio 0-1).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_straggler_individual_score",
        "gauge",
        "This rank's best compute time / its current one, at the last report (ratio 0-1).",
        _R,
    ),
    # ---- per rank ----
    MetricSpec(
        "rankguard_rank_info",
        "gauge",
        "Always 1: where a rank runs (join on rank to group other metrics by node).",
        (*_R, "node_rank", "local_rank"),
    ),
    MetricSpec(
        "rankguard_rank_process_liveness",
        "gauge",
        "1 for the rank's current process liveness state, 0 for the others.",
        (*_R, "state"),
    ),
    MetricSpec(
        "rankguard_rank_gpu_progress",
        "gauge",
        "1 for the rank's current training-progress state, 0 for the others.",
        (*_R, "state"),
    ),
    MetricSpec(
        "rankguard_rank_heartbeat_age_seconds",
        "gauge",
        "Seconds since the monitor last received a heartbeat record of the rank.",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_progress_age_seconds",
        "gauge",
        "Seconds since the rank last completed a step (or since start, before the first).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_iteration",
        "gauge",
        "Last completed training iteration of the rank (the script's numbering).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_steps_total",
        "counter",
        "Steps completed by the rank's current process (checkpoint saves count as one); "
        "resets when the rank restarts.",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_checkpoint_active",
        "gauge",
        "1 while the rank is saving a checkpoint, else 0.",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_active_findings",
        "gauge",
        "Findings currently active for the rank (0 when healthy).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_step_time_seconds",
        "gauge",
        "Mean step time of the rank's latest performance window (device time on GPU).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_flops_per_second",
        "gauge",
        "Achieved model FLOP/s per GPU of the rank's latest performance window "
        "(global-batch FLOPs / step time / world size).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_mfu_ratio",
        "gauge",
        "Model FLOPs utilisation of the rank's latest performance window (achieved / peak "
        "FLOP/s per GPU, 0-1; absent without a peak, e.g. on CPU).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_memory_bytes",
        "gauge",
        "Memory in use by the rank at its latest performance window "
        "(CUDA allocator on GPU, resident set size on CPU).",
        _R,
    ),
    MetricSpec(
        "rankguard_rank_finding_active",
        "gauge",
        "1 for each finding type active for the rank now (absent when none).",
        (*_R, "finding_type"),
    ),
    # ---- job ----
    MetricSpec(
        "rankguard_job_state",
        "gauge",
        "1 for the job's current state, 0 for the others.",
        (*_RUN, "state"),
    ),
    MetricSpec("rankguard_job_ranks_expected", "gauge", "Ranks the job should have.", _RUN),
    MetricSpec("rankguard_job_ranks_observed", "gauge", "Ranks that published a record.", _RUN),
    MetricSpec(
        "rankguard_job_ranks_process_liveness",
        "gauge",
        "Number of ranks in each process liveness state.",
        (*_RUN, "state"),
    ),
    MetricSpec(
        "rankguard_job_ranks_gpu_progress",
        "gauge",
        "Number of ranks in each training-progress state.",
        (*_RUN, "state"),
    ),
    MetricSpec(
        "rankguard_job_step_time_seconds",
        "gauge",
        "Step time across ranks (min, median, max over ranks) of the latest performance "
        "window every rank reported.",
        (*_RUN, "stat"),
    ),
    MetricSpec(
        "rankguard_job_perf_iteration",
        "gauge",
        "Iteration of the window that rankguard_job_step_time_seconds describes.",
        _RUN,
    ),
    MetricSpec(
        "rankguard_job_restarts_total",
        "counter",
        "Restarts of the job since its launcher started (process restarts of the worker "
        "group and in-process restarts), by kind.",
        (*_RUN, "kind"),
    ),
    MetricSpec(
        "rankguard_goodput_ettr_ratio",
        "gauge",
        "Effective training time ratio of the job so far: productive training over wall "
        "time (0-1), from the goodput ledger.",
        _RUN,
    ),
    MetricSpec(
        "rankguard_goodput_seconds",
        "gauge",
        "The job's wall time so far in each part of the goodput ledger (productive, "
        "startup, recomputed, checkpoint_stall, evaluation, detection_wait, recovery, "
        "rerun_validation, preemption_drain, unknown); the parts sum to the wall time.",
        (*_RUN, "part"),
    ),
    MetricSpec(
        "rankguard_goodput_wall_seconds",
        "gauge",
        "The job's wall time that the goodput ledger accounts for (first start to now).",
        _RUN,
    ),
    MetricSpec(
        "rankguard_checkpoint_last_step",
        "gauge",
        "Step of the newest committed checkpoint, by tier (persistent, local).",
        (*_RUN, "tier"),
    ),
    MetricSpec(
        "rankguard_checkpoint_age_seconds",
        "gauge",
        "Seconds since the newest checkpoint of the tier was committed.",
        (*_RUN, "tier"),
    ),
    MetricSpec(
        "rankguard_checkpoint_failures_total",
        "counter",
        "Checkpoint saves that failed since the job started (rank 0's manager).",
        _RUN,
    ),
    MetricSpec(
        "rankguard_findings_total",
        "counter",
        "Findings reported by the monitor since the exporter started, by type.",
        (*_RUN, "finding_type"),
    ),
    MetricSpec("rankguard_findings_active", "gauge", "Findings active now, over all ranks.", _RUN),
    # ---- GPU health, per node ----
    MetricSpec(
        "rankguard_node_gpu_health",
        "gauge",
        "1 for the node's current GPU health status, 0 for the others.",
        (*_RUN, "node_rank", "status"),
    ),
    MetricSpec(
        "rankguard_node_gpu_health_age_seconds",
        "gauge",
        "Age of the node's latest GPU health snapshot as seen by the monitor.",
        (*_RUN, "node_rank"),
    ),
    # ---- the monitor itself ----
    MetricSpec(
        "rankguard_monitor_scans_total", "counter", "Scans the job monitor completed.", _RUN
    ),
    MetricSpec(
        "rankguard_monitor_scan_errors_total",
        "counter",
        "Scans that failed with an exception (logged by the monitor).",
        _RUN,
    ),
    MetricSpec(
        "rankguard_monitor_ignored_records_total",
        "counter",
        "Heartbeat records ignored (other run id, old pid, malformed).",
        _RUN,
    ),
    MetricSpec(
        "rankguard_monitor_scan_seconds", "gauge", "Duration of the monitor's last scan.", _RUN
    ),
    MetricSpec(
        "rankguard_monitor_state",
        "gauge",
        "1 for the job monitor's current state (failing: its scans raise), 0 for the others.",
        (*_RUN, "state"),
    ),
    MetricSpec(
        "rankguard_exporter_ranks_with_series",
        "gauge",
        "Ranks exported with per-rank series (perf.prometheus.rank_series, worst first).",
        _RUN,
    ),
    MetricSpec(
        "rankguard_monitor_status_age_seconds",
        "gauge",
        "Seconds since the monitor last rebuilt its status (grows if the monitor is stuck).",
        _RUN,
    ),
    # ---- live recovery (standbys; rankguard.exporter.live) ----
    *(MetricSpec(*row) for row in LIVE_METRICS),
)
_SPECS = {spec.name: spec for spec in METRICS}


class FindingCounts:
    """Findings seen so far, by ``finding_type``; fed by the exporter's finding sink."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys((t.value for t in FindingType), 0)

    def observe(self, finding: Finding | JsonInput) -> None:
        """One more of its type (a line of a newer writer: counted under its own name)."""
        if isinstance(finding, Finding):
            ftype: object = finding.finding_type.value
        else:
            ftype = finding.get("finding_type")
        key = ftype if isinstance(ftype, str) and ftype else "unknown"
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _num(value: object, scale: float = 1.0) -> float | None:
    """``value * scale`` as a float, or None for a missing or non-numeric value."""
    number = as_float(value)
    return None if number is None else number * scale


def _label(value: Any) -> str:
    return "" if value is None else str(value)


def _age_since(iso: Any, now_wall: float) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return max(0.0, now_wall - datetime.fromisoformat(iso).timestamp())
    except (ValueError, OverflowError, OSError):
        return None


def rank_labels(row: RankRow | JsonObject) -> list[str]:
    """A rank's :data:`DCGM_LABELS` values, as dcgm-exporter names its GPU: the GPU
    entry the monitor matched in the node's health snapshot (NVML index, UUID, model),
    else what the rank knows itself (a ``GPU-`` UUID; a numeric ``CUDA_VISIBLE_DEVICES``
    entry as the index); empty where unknown, never a guess from the CUDA ordinal."""
    if isinstance(row, dict):
        row = RankRow.from_dict(row)
    health = row.gpu_health_info or RankGpuHealth()
    gpu = row.gpu_info or RankGpu()
    index: int | str | None = health.index
    token = (gpu.token or "").strip()
    if index is None and token.isdigit():
        index = token
    uuid = health.uuid or gpu.uuid
    if not uuid and token.upper().startswith("GPU-"):
        uuid = token
    return [_label(row.hostname), _label(index), _label(uuid), _label(health.name)]


def build_families(
    status: JsonObject | StatusDoc,
    *,
    scans: int,
    scan_errors: int,
    last_scan_s: float,
    finding_counts: dict[str, int],
    now_wall: float,
    rank_rows: list[JsonObject] | list[RankRow] | None = None,
    run_id: str | None = None,
) -> list[Metric]:
    """The families of :data:`METRICS` that have samples, from one ``status.json`` (read
    through :class:`StatusDoc`).

    A value the status does not have (a rank not observed yet, no FLOPs configured) is
    left out rather than exported as 0; state gauges always carry every state.
    ``rank_rows``: the ranks with per-rank series (default: every row of the status);
    ``run_id``: the ``run_id`` label (default: the status's).
    """
    present = bool(status)
    doc = status if isinstance(status, StatusDoc) else StatusDoc.from_dict(status)
    fam = {name: spec.family() for name, spec in _SPECS.items()}
    run = _label(run_id if run_id is not None else doc.run_id)

    def put(name: str, labels: Iterable[str], value: float | None) -> None:
        if value is not None:
            fam[name].add_metric([run, *labels], value)

    if rank_rows is None:
        rows = doc.ranks
    else:
        rows = [r if isinstance(r, RankRow) else RankRow.from_dict(r) for r in rank_rows]
    if present:
        put("rankguard_exporter_ranks_with_series", [], float(len(rows)))
    where: dict[str, list[str]] = {}  # rank -> its rank and GPU labels
    for row in rows:
        r = where[_label(row.rank)] = [_label(row.rank), *rank_labels(row)]
        _rank_families(put, row, r)
    _straggler_families(put, doc.block(StragglersBlock), where)
    if present:
        _job_families(put, doc, now_wall)
    job_perf = doc.perf_info
    for stat in _STATS:
        put("rankguard_job_step_time_seconds", [stat], _num(job_perf.step_time_ms.get(stat), _MS))
    put("rankguard_job_perf_iteration", [], _num(job_perf.iteration))

    for node, health in sorted(doc.gpu_health.items()):
        for s in _NODE_STATUS:
            put("rankguard_node_gpu_health", [str(node), s], 1.0 if s == health.status else 0.0)
        put("rankguard_node_gpu_health_age_seconds", [str(node)], _num(health.age_s))

    for ftype, count in sorted(finding_counts.items()):
        put("rankguard_findings_total", [ftype], float(count))
    put("rankguard_monitor_scans_total", [], float(scans))
    put("rankguard_monitor_scan_errors_total", [], float(scan_errors))
    put("rankguard_monitor_scan_seconds", [], float(last_scan_s))
    return [f for f in fam.values() if f.samples]  # absent, not zero, when unknown


_Put = Callable[[str, Iterable[str], "float | None"], None]


def _rank_families(put: _Put, row: RankRow, r: list[str]) -> None:
    """``r``: the rank's labels (rank and its GPU's dcgm-exporter labels)."""
    if row.pid is not None:
        put("rankguard_rank_info", [*r, _label(row.node_rank), _label(row.local_rank)], 1.0)
    for name, states, current in (
        ("rankguard_rank_process_liveness", _LIVENESS, row.process_liveness),
        ("rankguard_rank_gpu_progress", _PROGRESS, row.gpu_progress),
    ):
        for state in states:
            put(name, [*r, state], 1.0 if state == current else 0.0)
    put("rankguard_rank_heartbeat_age_seconds", r, _num(row.heartbeat_age_s))
    put("rankguard_rank_progress_age_seconds", r, _num(row.progress_age_s))
    put("rankguard_rank_iteration", r, _num(row.iteration))
    put("rankguard_rank_steps_total", r, _num(row.progress_seq))
    if row.pid is not None:
        put("rankguard_rank_checkpoint_active", r, float(row.checkpoint_active))
    put("rankguard_rank_active_findings", r, float(len(row.active_findings)))
    for ftype in row.active_findings:
        put("rankguard_rank_finding_active", [*r, _label(ftype)], 1.0)
    perf = row.perf_info
    put("rankguard_rank_step_time_seconds", r, _num(perf.step_time_ms, _MS))
    put("rankguard_rank_flops_per_second", r, _num(perf.tflops_per_gpu, _TFLOPS))
    put("rankguard_rank_mfu_ratio", r, _num(perf.mfu))
    put("rankguard_rank_memory_bytes", r, _num(perf.memory_gb, _GB))


def _straggler_families(
    put: _Put, stragglers: StragglersBlock | None, where: dict[str, list[str]]
) -> None:
    for rank_key, score in stragglers.scores.items() if stragglers is not None else ():
        label = _label(rank_key)
        r = where.get(label) or [label, "", "", "", ""]
        put("rankguard_rank_straggler_relative_score", r, _num(score.relative))
        put("rankguard_rank_straggler_individual_score", r, _num(score.individual))


def _job_families(put: _Put, doc: StatusDoc, now_wall: float) -> None:
    for s in JOB_STATES:
        put("rankguard_job_state", [s], 1.0 if s == doc.state else 0.0)
    summary = doc.summary
    put("rankguard_job_ranks_expected", [], _num(summary.ranks_expected))
    put("rankguard_job_ranks_observed", [], _num(summary.ranks_observed))
    for name, states, counts in (
        ("rankguard_job_ranks_process_liveness", _LIVENESS, summary.process_liveness),
        ("rankguard_job_ranks_gpu_progress", _PROGRESS, summary.gpu_progress),
    ):
        for s in states:
            put(name, [s], float(counts.get(s, 0)))
    put("rankguard_findings_active", [], _num(summary.findings_active))
    put("rankguard_monitor_ignored_records_total", [], _num(doc.monitor.ignored_records))
    for s in MONITOR_STATES:
        put("rankguard_monitor_state", [s], 1.0 if s == doc.monitor.state else 0.0)
    put(
        "rankguard_monitor_status_age_seconds",
        [],
        _age_since(doc.updated_wall_time, now_wall),
    )
    kinds: dict[str, int] = {"process": 0, "inprocess": 0}
    restarts = doc.block(RestartsBlock)
    for entry in restarts.entries if restarts is not None else ():
        kind = _label(entry.kind)
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind, count in sorted(kinds.items()):
        put("rankguard_job_restarts_total", [kind], float(count))
    _checkpoint_series(doc.block(CheckpointsBlock), now_wall, put)
    _goodput_series(doc.block(GoodputBlock), put)
    live_series(put, doc.block(LiveBlock))


def _goodput_series(block: GoodputBlock | None, put: _Put) -> None:
    """status.json's ``goodput`` block (node 0's ledger, at most 30 s old)."""
    if block is None:
        return
    put("rankguard_goodput_ettr_ratio", [], _num(block.ettr))
    put("rankguard_goodput_wall_seconds", [], _num(block.wall_s))
    for part in PARTS:
        put("rankguard_goodput_seconds", [part.value], _num(block.parts_s.get(part.value)))


def _checkpoint_series(ckpt: CheckpointsBlock | None, now_wall: float, put: _Put) -> None:
    """``checkpoints.json`` (rank 0's manager, merged into the status): each tier's
    newest committed step and its age; failed saves."""
    if ckpt is None:
        return
    for tier, step in sorted(ckpt.last_committed.items()):
        if step is None:
            continue
        put("rankguard_checkpoint_last_step", [_label(tier)], float(step))
        info = ckpt.last.get(tier)
        if info is not None:
            age = _age_since(info.time, now_wall)
            put("rankguard_checkpoint_age_seconds", [_label(tier)], age)
    put("rankguard_checkpoint_failures_total", [], float(ckpt.failures))


class StatusCollector(Collector):
    """Reads ``monitor.status`` (one consistent dict per scan) at every scrape."""

    def __init__(
        self,
        monitor: JobMonitor,
        findings: FindingCounts,
        *,
        rank_series: int | None = None,
        all_ranks: bool = False,
    ) -> None:
        self.monitor = monitor
        self.findings = findings
        self.rank_series = rank_series
        self.all_ranks = all_ranks

    def _rank_rows(self, doc: StatusDoc) -> list[RankRow]:
        """Per-rank series budget: every rank on request, else the worst ``rank_series``."""
        rows = doc.ranks
        if self.all_ranks:
            if not doc.rank_detail.complete:
                return self.monitor.rank_rows()  # a large job: rows from the rules
            return rows
        if self.rank_series is None or len(rows) <= self.rank_series:
            return rows
        return worst_rows(rows, self.rank_series)

    def describe(self) -> Iterator[Metric]:
        """The catalogue without samples: registers the names without a scan."""
        for spec in METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        status = m.status  # replaced whole by each scan: a coherent snapshot
        doc = StatusDoc.from_dict(status)
        yield from build_families(
            doc if status else status,  # none yet: no series that say it is there
            scans=m.scan_count,
            scan_errors=m.scan_errors,
            last_scan_s=m.last_scan_s,
            finding_counts=self.findings.snapshot(),
            now_wall=time.time(),
            rank_rows=self._rank_rows(doc),
            run_id=m.run_id,
        )
