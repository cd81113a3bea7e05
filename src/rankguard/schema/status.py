"""``status.json`` as one typed object: :class:`StatusDoc` and its blocks.

The monitor writes the file through :meth:`StatusDoc.to_dict`; every reader (``rankguard
status``, the report, the Prometheus exporter, :mod:`rankguard.view.runfiles`) reads it through
:meth:`StatusDoc.from_dict`. Users' scripts read the file too, so its keys and their
order are the product's: ``to_dict(from_dict(d)) == d`` for a file the monitor wrote
(``tests/unit/schema/test_status_doc.py`` freezes the keys).

Reading is tolerant: a missing block or a value of the wrong type reads as its default
(``None``, empty), never raises, so a status written by an older or newer monitor (or cut
by hand) still renders. Blocks that belong to other parts (an evaluator's
``status()``, a status source's fields: ``stragglers``, ``rerun``, ``preemption``,
``checkpoints``, ``timeouts``, ``restarts``, ...) are kept as they came, in order, and
read with :meth:`StatusDoc.block`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, overload

from rankguard.schema.coerce import as_dict, as_float, as_int, as_list, as_number, as_str
from rankguard.schema.findings import Finding
from rankguard.schema.jsontypes import JsonObject, JsonValue
from rankguard.schema.records import SCHEMA_VERSION

__all__ = [
    "FINAL_STATES",
    "JobPerf",
    "MonitorInfo",
    "NodeHealth",
    "RankDetail",
    "RankExit",
    "RankGpu",
    "RankGpuHealth",
    "RankPerf",
    "RankRow",
    "RankTable",
    "StatusDoc",
    "StatusSummary",
    "mark_selected",
    "parse_findings",
    "raw_rank_rows",
]

#: The states a run ends in (``status.json["state"]`` once its launcher stopped
#: monitoring): ``completed`` (every rank ended cleanly), ``failed`` (a rank failed, or
#: the launcher ended the job on a finding), ``stopped`` (the launcher stopped the
#: workers on a signal). The others (``starting``, ``running``, ``degraded``) are of a
#: run under way.
FINAL_STATES = frozenset({"completed", "failed", "stopped"})

_B = TypeVar("_B")  # a block class of rankguard.schema.statusblocks


def _counts(v: object) -> dict[str, int]:
    if not isinstance(v, dict):
        return {}
    return {str(k): n for k, n in v.items() if type(n) is int}


def _extra(d: JsonObject, known: frozenset[str]) -> JsonObject:
    return {k: v for k, v in d.items() if k not in known}


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank row's ``exit`` (the end record's ``exit`` block with the monitor's notes),
    read: clean or not, the exit code, and why the process ended when the launcher or
    another rank took it down (``after_shutdown``, ``after_restart``, ``after_action``:
    the reason noted; ``after_failure_of_rank``: the rank that failed first)."""

    clean: bool | None = None
    exit_code: int | None = None
    after_shutdown: str | None = None
    after_restart: str | None = None
    after_action: str | None = None
    after_failure_of_rank: int | None = None

    @classmethod
    def from_json(cls, d: object) -> RankExit:
        if not isinstance(d, dict):
            return cls()
        clean = d.get("clean")
        return cls(
            clean=clean if isinstance(clean, bool) else None,
            exit_code=as_int(d.get("exit_code")),
            after_shutdown=as_str(d.get("after_shutdown")),
            after_restart=as_str(d.get("after_restart")),
            after_action=as_str(d.get("after_action")),
            after_failure_of_rank=as_int(d.get("after_failure_of_rank")),
        )


@dataclass(frozen=True, slots=True)
class RankGpu:
    """A rank row's ``gpu``: what the rank knows of its GPU (its ``CUDA_VISIBLE_DEVICES``
    entry ``token``, the CUDA ``ordinal``, the ``uuid`` when it read one)."""

    token: str | None = None
    ordinal: int | None = None
    uuid: str | None = None

    @classmethod
    def from_json(cls, d: object) -> RankGpu:
        if not isinstance(d, dict):
            return cls()
        return cls(
            token=as_str(d.get("token")),
            ordinal=as_int(d.get("ordinal")),
            uuid=as_str(d.get("uuid")),
        )


@dataclass(frozen=True, slots=True)
class RankGpuHealth:
    """A rank row's ``gpu_health``: the entry of its node's GPU health snapshot the
    monitor matched to the rank's GPU (NVML ``index``, ``uuid``, model ``name``, the
    verdict ``health``; ``status`` where a writer put the verdict under that key)."""

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    health: str | None = None
    status: str | None = None

    @classmethod
    def from_json(cls, d: object) -> RankGpuHealth:
        if not isinstance(d, dict):
            return cls()
        return cls(
            index=as_int(d.get("index")),
            uuid=as_str(d.get("uuid")),
            name=as_str(d.get("name")),
            health=as_str(d.get("health")),
            status=as_str(d.get("status")),
        )

    @property
    def verdict(self) -> str | None:
        """The GPU's verdict (``ok``, ``warning``, ``unhealthy``; None: not known)."""
        return self.health or self.status


@dataclass(frozen=True, slots=True)
class RankPerf:
    """A rank row's ``perf``: its latest perf window's figures (step time in ms,
    TFLOPS per GPU, MFU as a ratio, memory in decimal GB)."""

    step_time_ms: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    memory_gb: float | None = None

    @classmethod
    def from_json(cls, d: object) -> RankPerf:
        if not isinstance(d, dict):
            return cls()
        return cls(
            step_time_ms=as_float(d.get("step_time_ms")),
            tflops_per_gpu=as_float(d.get("TFLOPS_per_GPU")),
            mfu=as_float(d.get("MFU")),
            memory_gb=as_float(d.get("memory_GB")),
        )


@dataclass(frozen=True, slots=True)
class JobPerf:
    """``status.json["perf"]``: the latest perf line across ranks (its step, the
    script's iteration, the step time's statistics in ms by name: ``min``, ``median``,
    ``max``, ...)."""

    step: int | None = None
    iteration: int | None = None
    step_time_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: object) -> JobPerf:
        if not isinstance(d, dict):
            return cls()
        stats = as_dict(d.get("step_time_ms")) or {}
        return cls(
            step=as_int(d.get("step")),
            iteration=as_int(d.get("iteration")),
            step_time_ms={
                str(k): number for k, v in stats.items() if (number := as_float(v)) is not None
            },
        )


@dataclass(slots=True)
class RankRow:
    """One rank's row (``status.json["ranks"]``; ``status_ranks.json`` holds the first
    columns of it, :data:`rankguard.monitor.status.DETAIL_COLUMNS`)."""

    rank: int | None = None
    pid: int | None = None
    hostname: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    process_liveness: str | None = None
    gpu_progress: str | None = None
    iteration: int | None = None
    iteration_source: str | None = None  # script, checkpoint, steps (where iteration comes from)
    progress_seq: int | None = None
    phase: str | None = None
    phases_seen: list[str] = field(default_factory=list)
    checkpoint_active: bool = False
    heartbeat_age_s: float | None = None
    progress_age_s: float | None = None
    progress_source: str | None = None
    perf: JsonObject | None = None
    gpu: JsonObject | None = None
    gpu_health: JsonObject | None = None
    exit: JsonObject | None = None
    active_findings: list[str] = field(default_factory=list)
    blocked_by: list[int] = field(default_factory=list)
    extra: JsonObject = field(default_factory=dict)  # keys of a newer writer

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "rank": self.rank,
            "pid": self.pid,
            "hostname": self.hostname,
            "node_rank": self.node_rank,
            "local_rank": self.local_rank,
            "process_liveness": self.process_liveness,
            "gpu_progress": self.gpu_progress,
            "iteration": self.iteration,
            "iteration_source": self.iteration_source,
            "progress_seq": self.progress_seq,
            "phase": self.phase,
            "phases_seen": [*self.phases_seen],
            "checkpoint_active": self.checkpoint_active,
            "heartbeat_age_s": self.heartbeat_age_s,
            "progress_age_s": self.progress_age_s,
            "progress_source": self.progress_source,
            "perf": self.perf,
            "gpu": self.gpu,
            "gpu_health": self.gpu_health,
            "exit": self.exit,
            "active_findings": [*self.active_findings],
            "blocked_by": [*self.blocked_by],
        }
        if self.extra:
            out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: JsonObject) -> RankRow:
        return cls(
            rank=as_int(d.get("rank")),
            pid=as_int(d.get("pid")),
            hostname=as_str(d.get("hostname")),
            node_rank=as_int(d.get("node_rank")),
            local_rank=as_int(d.get("local_rank")),
            process_liveness=as_str(d.get("process_liveness")),
            gpu_progress=as_str(d.get("gpu_progress")),
            iteration=as_int(d.get("iteration")),
            iteration_source=as_str(d.get("iteration_source")),
            progress_seq=as_int(d.get("progress_seq")),
            phase=as_str(d.get("phase")),
            phases_seen=[p for p in as_list(d.get("phases_seen")) if isinstance(p, str)],
            checkpoint_active=d.get("checkpoint_active") is True,
            heartbeat_age_s=as_number(d.get("heartbeat_age_s")),
            progress_age_s=as_number(d.get("progress_age_s")),
            progress_source=as_str(d.get("progress_source")),
            perf=as_dict(d.get("perf")),
            gpu=as_dict(d.get("gpu")),
            gpu_health=as_dict(d.get("gpu_health")),
            exit=as_dict(d.get("exit")),
            active_findings=[str(f) for f in as_list(d.get("active_findings"))],
            blocked_by=[r for r in as_list(d.get("blocked_by")) if type(r) is int],
            extra=_extra(d, _ROW_KEYS),
        )

    @property
    def exit_info(self) -> RankExit | None:
        """``exit``, typed (None: the rank has not ended)."""
        return None if self.exit is None else RankExit.from_json(self.exit)

    @property
    def gpu_info(self) -> RankGpu | None:
        """``gpu``, typed (None: the rank did not say)."""
        return None if self.gpu is None else RankGpu.from_json(self.gpu)

    @property
    def gpu_health_info(self) -> RankGpuHealth | None:
        """``gpu_health``, typed (None: no snapshot entry matched the rank's GPU)."""
        return None if self.gpu_health is None else RankGpuHealth.from_json(self.gpu_health)

    @property
    def perf_info(self) -> RankPerf:
        """``perf``, typed (every figure None when the rank has no perf window)."""
        return RankPerf.from_json(self.perf)

    @classmethod
    def from_columns(cls, columns: list[str], values: list[JsonValue]) -> RankRow:
        """A row of ``status_ranks.json`` (``columns`` names its values)."""
        return cls.from_dict(dict(zip(columns, values, strict=False)))


_ROW_KEYS = frozenset(RankRow.__dataclass_fields__) - {"extra"}


def raw_rank_rows(status: JsonObject) -> list[JsonObject]:
    """``status["ranks"]``'s rows as they came (objects only): for a reader that prints
    them as written (a newer writer's keys, a ``status_ranks.json`` row's first columns)."""
    return [r for r in as_list(status.get("ranks")) if isinstance(r, dict)]


def mark_selected(status: JsonObject) -> None:
    """Say in ``status["rank_detail"]`` that ``ranks`` holds rows a reader picked
    (:attr:`RankDetail.selected`)."""
    status["rank_detail"] = {**(as_dict(status.get("rank_detail")) or {}), "selected": True}


@dataclass(frozen=True, slots=True)
class RankTable:
    """``status_ranks.json``: every rank's first columns (``columns`` names them), one
    list per rank, the rank first."""

    columns: list[str]
    rows: list[list[JsonValue]]

    @classmethod
    def from_json(cls, d: object) -> RankTable | None:
        """None when ``d`` has no list of columns."""
        columns = d.get("columns") if isinstance(d, dict) else None
        if not isinstance(d, dict) or not isinstance(columns, list):
            return None
        rows = [r for r in as_list(d.get("rows")) if isinstance(r, list) and r]
        return cls([str(c) for c in columns], rows)

    def rows_of(self, ranks: set[int]) -> dict[int, JsonObject]:
        """The rows of ``ranks`` as objects (the columns' names as keys), by rank."""
        return {
            rank: dict(zip(self.columns, row, strict=False))
            for row in self.rows
            if (rank := as_int(row[0])) is not None and rank in ranks
        }


@dataclass(slots=True)
class MonitorInfo:
    """``status.json["monitor"]``: who scans, how scans go, what was dropped or unwritten."""

    hostname: str | None = None
    pid: int | None = None
    pid_start: int | None = None  # with the pid: is that launcher still the one running?
    scan_count: int | None = None
    scan_errors: int | None = None
    state: str | None = None  # scanning, failing, stopped
    errors: int | None = None
    consecutive_errors: int | None = None
    last_error: str | None = None
    last_scan_s: float | None = None
    last_scan_cpu_s: float | None = None
    last_status_write_s: float | None = None
    status_bytes: int | None = None
    expected_world_size: int | None = None
    ignored_records: int | None = None
    last_ignored: str | None = None
    rank_errors: int | None = None
    sink_errors: int | None = None
    unwritten_findings: int | None = None
    unwritten_perf_lines: int | None = None
    dropped_lines: int | None = None
    write_errors: int | None = None
    status_write_errors: int | None = None
    last_write_error: str | None = None
    config: JsonObject | None = None
    holds: int | None = None  # scans that began late: the monitor itself held up
    held_s: float | None = None  # the total of those delays, seconds
    extra: JsonObject = field(default_factory=dict)

    present: tuple[str, ...] | None = None  # the keys read (None: every key)

    def to_dict(self) -> JsonObject:
        names = _MONITOR_FIELDS if self.present is None else self.present
        out = {name: getattr(self, name) for name in names}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: object) -> MonitorInfo:
        if not isinstance(d, dict):
            return cls(present=())
        present = tuple(n for n in _MONITOR_FIELDS if n in d)
        info = cls(
            extra=_extra(d, frozenset(_MONITOR_FIELDS)),
            present=None if len(present) == len(_MONITOR_FIELDS) else present,
        )
        for name in _MONITOR_FIELDS:  # each value narrowed to its field's type
            setattr(info, name, _MONITOR_KINDS[name](d.get(name)))
        return info


_MONITOR_FIELDS = tuple(
    n for n in MonitorInfo.__dataclass_fields__ if n not in ("extra", "present")
)
_MONITOR_STR = ("hostname", "state", "last_error", "last_ignored", "last_write_error")
_MONITOR_KINDS: dict[str, Callable[[object], JsonValue]] = {
    n: as_dict
    if n == "config"
    else as_str
    if n in _MONITOR_STR
    else as_number
    if n.endswith("_s")
    else as_int
    for n in _MONITOR_FIELDS
}


@dataclass(slots=True)
class StatusSummary:
    """``status.json["summary"]``: counts over every rank, listed or not."""

    ranks_expected: int | None = None
    ranks_observed: int | None = None
    process_liveness: dict[str, int] = field(default_factory=dict)
    gpu_progress: dict[str, int] = field(default_factory=dict)
    findings_total: int | None = None
    findings_active: int | None = None
    extra: JsonObject = field(default_factory=dict)
    present: bool = True  # False: the status had no summary block

    def to_dict(self) -> JsonObject:
        return {
            "ranks_expected": self.ranks_expected,
            "ranks_observed": self.ranks_observed,
            "process_liveness": {**self.process_liveness},
            "gpu_progress": {**self.gpu_progress},
            "findings_total": self.findings_total,
            "findings_active": self.findings_active,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: object) -> StatusSummary:
        if not isinstance(d, dict):
            return cls(present=False)
        return cls(
            ranks_expected=as_int(d.get("ranks_expected")),
            ranks_observed=as_int(d.get("ranks_observed")),
            process_liveness=_counts(d.get("process_liveness")),
            gpu_progress=_counts(d.get("gpu_progress")),
            findings_total=as_int(d.get("findings_total")),
            findings_active=as_int(d.get("findings_active")),
            extra=_extra(d, _SUMMARY_KEYS),
        )


_SUMMARY_KEYS = frozenset(StatusSummary.__dataclass_fields__) - {"extra", "present"}


@dataclass(slots=True)
class RankDetail:
    """``status.json["rank_detail"]``: whether ``ranks`` lists every rank (else the worst,
    and every rank is in ``file``, ``status_ranks.json``)."""

    complete: bool = True
    listed: int | None = None
    file: str | None = None
    written_wall_time: str | None = None
    extra: JsonObject = field(default_factory=dict)  # ``selected``: rows picked by a reader

    def to_dict(self) -> JsonObject:
        return {
            "complete": self.complete,
            "listed": self.listed,
            "file": self.file,
            "written_wall_time": self.written_wall_time,
            **self.extra,
        }

    @property
    def selected(self) -> bool:
        """Does ``ranks`` hold rows a reader picked (``rankguard status --ranks/--worst``)?"""
        return bool(self.extra.get("selected"))

    @classmethod
    def from_dict(cls, d: object) -> RankDetail:
        if not isinstance(d, dict):
            return cls()
        return cls(
            complete=d.get("complete") is not False,
            listed=as_int(d.get("listed")),
            file=as_str(d.get("file")),
            written_wall_time=as_str(d.get("written_wall_time")),
            extra=_extra(d, frozenset(("complete", "listed", "file", "written_wall_time"))),
        )


@dataclass(slots=True)
class NodeHealth:
    """One node's GPU health in ``status.json["gpu_health"]`` (keyed by node rank)."""

    status: str | None = None
    source: str | None = None
    hostname: str | None = None
    age_s: float | None = None
    gpus: int | None = None
    extra: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        return {
            "status": self.status,
            "source": self.source,
            "hostname": self.hostname,
            "age_s": self.age_s,
            "gpus": self.gpus,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: object) -> NodeHealth:
        if not isinstance(d, dict):
            return cls()
        return cls(
            status=as_str(d.get("status")),
            source=as_str(d.get("source")),
            hostname=as_str(d.get("hostname")),
            age_s=as_number(d.get("age_s")),
            gpus=as_int(d.get("gpus")),
            extra=_extra(d, frozenset(("status", "source", "hostname", "age_s", "gpus"))),
        )


def parse_findings(lines: object) -> tuple[list[Finding], int]:
    """The findings among ``lines`` (dicts of ``findings.jsonl``), and how many were not
    findings (a wrong type, an unknown finding type or reason, a bad field): skipped and
    counted, never raised."""
    out: list[Finding] = []
    bad = 0
    for line in lines if isinstance(lines, list | tuple) else ():
        if not isinstance(line, dict):
            bad += 1
            continue
        try:
            out.append(Finding.from_dict(line))
        except (ValueError, TypeError):
            bad += 1
    return out, bad


@dataclass(slots=True)
class StatusDoc:
    """The whole ``status.json``. ``blocks`` are the evaluators' blocks (written between
    ``stragglers`` and ``recent_findings``) and ``fields`` the status sources' fields
    (written after ``recent_findings``), both in order, as they came."""

    run_id: str | None = None
    updated_wall_time: str | None = None
    state: str | None = None
    monitor: MonitorInfo = field(default_factory=MonitorInfo)
    summary: StatusSummary = field(default_factory=StatusSummary)
    ranks: list[RankRow] = field(default_factory=list)
    rank_detail: RankDetail = field(default_factory=RankDetail)
    gpu_health: dict[str, NodeHealth] = field(default_factory=dict)
    disks: dict[str, JsonObject] = field(default_factory=dict)
    perf: JsonObject | None = None
    stragglers: JsonValue = None
    blocks: JsonObject = field(default_factory=dict)
    recent_findings: list[JsonObject] = field(default_factory=list)
    fields: JsonObject = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> JsonObject:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "updated_wall_time": self.updated_wall_time,
            "state": self.state,
            "monitor": self.monitor.to_dict(),
            "summary": self.summary.to_dict(),
            "ranks": [r.to_dict() for r in self.ranks],
            "rank_detail": self.rank_detail.to_dict(),
            "gpu_health": {node: h.to_dict() for node, h in self.gpu_health.items()},
            "disks": {**self.disks},
            "perf": self.perf,
            "stragglers": self.stragglers,
            **self.blocks,
            "recent_findings": [*self.recent_findings],
            **self.fields,
        }

    @classmethod
    def from_dict(cls, d: object) -> StatusDoc:
        """Never raises: anything that is not a status reads as an empty one."""
        if not isinstance(d, dict):
            return cls(schema_version=0)
        blocks: JsonObject = {}
        fields_: JsonObject = {}
        after = False  # past recent_findings: a status source's field
        for key, value in d.items():
            if key == "recent_findings":
                after = True
            elif key not in _DOC_KEYS:
                (fields_ if after else blocks)[key] = value
        ranks = d.get("ranks")
        if isinstance(ranks, dict):  # an old writer keyed rows by rank
            ranks = list(ranks.values())
        health = d.get("gpu_health")
        return cls(
            schema_version=as_int(d.get("schema_version")) or 0,
            run_id=as_str(d.get("run_id")),
            updated_wall_time=as_str(d.get("updated_wall_time")),
            state=as_str(d.get("state")),
            monitor=MonitorInfo.from_dict(d.get("monitor")),
            summary=StatusSummary.from_dict(d.get("summary")),
            ranks=[RankRow.from_dict(r) for r in as_list(ranks) if isinstance(r, dict)],
            rank_detail=RankDetail.from_dict(d.get("rank_detail")),
            gpu_health={
                str(node): NodeHealth.from_dict(h)
                for node, h in (health.items() if isinstance(health, dict) else ())
            },
            disks={
                node: disk
                for node, disk in (as_dict(d.get("disks")) or {}).items()
                if isinstance(disk, dict)
            },
            perf=as_dict(d.get("perf")),
            stragglers=d.get("stragglers"),
            blocks=blocks,
            recent_findings=[f for f in as_list(d.get("recent_findings")) if isinstance(f, dict)],
            fields=fields_,
        )

    @overload
    def block(self, name: str) -> JsonValue: ...

    @overload
    def block(self, name: type[_B]) -> _B | None: ...

    def block(self, name: str | type[_B]) -> JsonValue | _B | None:
        """An evaluator's block or a status source's field (None when absent); given a
        block class of :mod:`rankguard.schema.statusblocks`, that block parsed."""
        if isinstance(name, type):
            raw = self.block(name.name)  # type: ignore[attr-defined]
            return None if raw is None else name.from_dict(raw)  # type: ignore[attr-defined]
        if name == "stragglers":
            return self.stragglers
        if name in self.fields:
            return self.fields[name]
        return self.blocks.get(name)

    @property
    def perf_info(self) -> JobPerf:
        """``perf``, typed (no step time statistics when no perf line came yet)."""
        return JobPerf.from_json(self.perf)

    def findings(self) -> tuple[list[Finding], int]:
        """``recent_findings`` as findings, and how many lines were skipped."""
        return parse_findings(self.recent_findings)


_DOC_KEYS = frozenset(StatusDoc.__dataclass_fields__) - {"blocks", "fields"}
