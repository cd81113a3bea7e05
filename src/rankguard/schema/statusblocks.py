"""The typed blocks of ``status.json`` that node 0's services write, and their registry
(as :mod:`rankguard.schema.blocks` is for the heartbeat records' blocks).

A writer returns its block (a :class:`StatusBlock`: ``name``, ``to_dict``), which the
node services turn into ``status.json``'s field of that name; a reader asks
:meth:`rankguard.schema.status.StatusDoc.block` for the class and gets the block parsed
(every value of the wrong type read as missing, never raised on: the ranks' files and
the store are not trusted), or None when the status has none. ``to_dict`` writes the
keys a reader found before, in their order, and keeps the ones it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar

from rankguard.schema.coerce import as_dict, as_int, as_list, as_number, as_str
from rankguard.schema.jsontypes import JsonObject, JsonValue

__all__ = [
    "STATUS_BLOCKS",
    "CheckpointEntry",
    "CheckpointsBlock",
    "ElasticBlock",
    "ElasticMember",
    "GoodputBlock",
    "LargestLoss",
    "PreemptBudget",
    "PreemptionBlock",
    "Replacement",
    "SpareWaiting",
    "StatusBlock",
    "StopRequestedBlock",
    "StragglerRow",
    "StragglerScores",
    "StragglersBlock",
    "TimeoutInForce",
    "TimeoutsBlock",
    "block_json",
    "status_block",
    "stop_words",
]


class StatusBlock(Protocol):
    """One block of ``status.json``: its key and its JSON form (an object, or a list
    for a block that is one, as ``restarts``)."""

    name: ClassVar[str]

    def to_dict(self) -> JsonValue: ...


B = TypeVar("B", bound=StatusBlock)

#: Every typed block, by its key in ``status.json``.
STATUS_BLOCKS: dict[str, type[StatusBlock]] = {}


def status_block(cls: type[B]) -> type[B]:
    """Register a block class (its ``name`` is its key; one class per key)."""
    name = cls.name
    assert name not in STATUS_BLOCKS, name
    STATUS_BLOCKS[name] = cls
    return cls


# ---- checkpoints (rank 0's checkpoint manager, ``checkpoints.json``) --------------------


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """The last committed checkpoint of a tier: its step, where, when, how long."""

    step: int | None = None
    path: str | None = None
    time: str | None = None
    stage_s: float | None = None
    write_s: float | None = None
    total_s: float | None = None
    extra: JsonObject = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("step", "path", "time", "stage_s", "write_s", "total_s")

    @classmethod
    def from_dict(cls, raw: object) -> CheckpointEntry | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            step=as_int(d.get("step")),
            path=as_str(d.get("path")),
            time=as_str(d.get("time")),
            stage_s=as_number(d.get("stage_s")),
            write_s=as_number(d.get("write_s")),
            total_s=as_number(d.get("total_s")),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )

    def to_dict(self) -> JsonObject:
        return {**{k: getattr(self, k) for k in self._KEYS}, **self.extra}


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """A save in flight (``since``) or the checkpoint the job resumed from (``path``)."""

    tier: str | None = None
    step: int | None = None
    since: str | None = None
    path: str | None = None
    keys: tuple[str, ...] = ()  # the keys it was read with, in order

    @classmethod
    def from_dict(cls, raw: object) -> CheckpointMark | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            tier=as_str(d.get("tier")),
            step=as_int(d.get("step")),
            since=as_str(d.get("since")),
            path=as_str(d.get("path")),
            keys=tuple(k for k in d if k in ("tier", "step", "since", "path")),
        )

    def to_dict(self) -> JsonObject:
        return {k: getattr(self, k) for k in self.keys}


@status_block
@dataclass(frozen=True, slots=True)
class CheckpointsBlock:
    """``checkpoints``: the last committed step and entry per tier, the saves, the
    failures, the write in flight and what the job resumed from."""

    name: ClassVar[str] = "checkpoints"

    rank: int | None = None
    world_size: int | None = None
    job: str | None = None
    async_save: bool = False
    last_committed: dict[str, int | None] = field(default_factory=dict)
    saves: dict[str, int | None] = field(default_factory=dict)
    failures: int = 0
    last_error: str | None = None
    last: dict[str, CheckpointEntry | None] = field(default_factory=dict)
    inflight: CheckpointMark | None = None
    loaded: CheckpointMark | None = None
    updated: str | None = None
    extra: JsonObject = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "rank",
        "world_size",
        "job",
        "async_save",
        "last_committed",
        "saves",
        "failures",
        "last_error",
        "last",
        "inflight",
        "loaded",
        "updated",
    )

    @classmethod
    def from_dict(cls, raw: object) -> CheckpointsBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        per_tier = {str(k): v for k, v in (as_dict(d.get("last_committed")) or {}).items()}
        last = {str(k): v for k, v in (as_dict(d.get("last")) or {}).items()}
        return cls(
            rank=as_int(d.get("rank")),
            world_size=as_int(d.get("world_size")),
            job=as_str(d.get("job")),
            async_save=d.get("async_save") is True,
            last_committed={k: as_int(v) for k, v in per_tier.items()},
            saves={str(k): as_int(v) for k, v in (as_dict(d.get("saves")) or {}).items()},
            failures=as_int(d.get("failures")) or 0,
            last_error=as_str(d.get("last_error")),
            last={k: CheckpointEntry.from_dict(v) for k, v in last.items()},
            inflight=CheckpointMark.from_dict(d.get("inflight")),
            loaded=CheckpointMark.from_dict(d.get("loaded")),
            updated=as_str(d.get("updated")),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )

    def to_dict(self) -> JsonObject:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "job": self.job,
            "async_save": self.async_save,
            "last_committed": dict(self.last_committed),
            "saves": dict(self.saves),
            "failures": self.failures,
            "last_error": self.last_error,
            "last": {k: v.to_dict() if v is not None else None for k, v in self.last.items()},
            "inflight": self.inflight.to_dict() if self.inflight is not None else None,
            "loaded": self.loaded.to_dict() if self.loaded is not None else None,
            "updated": self.updated,
            **self.extra,
        }


# ---- timeouts in force (the launcher's cadence) ----------------------------------------


@dataclass(frozen=True, slots=True)
class TimeoutInForce:
    """One timeout in force and where it came from (``config (<key>)``, ``learned``)."""

    value: float | None
    source: str | None


@status_block
@dataclass(frozen=True, slots=True)
class TimeoutsBlock:
    """``timeouts``: every phase's timeout in force, in the launcher's order."""

    name: ClassVar[str] = "timeouts"

    entries: dict[str, TimeoutInForce] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: object) -> TimeoutsBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        entries = {}
        for key, value in d.items():
            info = as_dict(value)
            if info is not None:
                entries[str(key)] = TimeoutInForce(
                    as_number(info.get("value")), as_str(info.get("source"))
                )
        return cls(entries)

    def to_dict(self) -> JsonObject:
        return {k: {"value": t.value, "source": t.source} for k, t in self.entries.items()}


def block_json(value: StatusBlock | JsonValue) -> JsonValue:
    """A status block's JSON form (its ``to_dict``); a JSON value as it is."""
    if isinstance(value, _JSON_TYPES) or value is None:
        return value
    return value.to_dict()


_JSON_TYPES = (bool, int, float, str, list, dict)


# ---- goodput (node 0's ledger) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LargestLoss:
    """The part of the wall time that cost the most, and how many seconds."""

    part: str | None
    seconds: float | None


@status_block
@dataclass(frozen=True, slots=True)
class GoodputBlock:
    """``goodput``: the run's ETTR, its wall and productive seconds, attempts,
    interruptions, the largest loss and the seconds of every part; ``final`` once the
    run is over."""

    name: ClassVar[str] = "goodput"

    final: bool = False
    wall_s: float | None = None
    ettr: float | None = None
    productive_s: float | None = None
    attempts: int | None = None
    interruptions: int | None = None
    largest_loss: LargestLoss | None = None
    parts_s: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: object) -> GoodputBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        loss = as_dict(d.get("largest_loss"))
        return cls(
            final=d.get("final") is True,
            wall_s=as_number(d.get("wall_s")),
            ettr=as_number(d.get("ettr")),
            productive_s=as_number(d.get("productive_s")),
            attempts=as_int(d.get("attempts")),
            interruptions=as_int(d.get("interruptions")),
            largest_loss=None
            if loss is None
            else LargestLoss(as_str(loss.get("part")), as_number(loss.get("seconds"))),
            parts_s={str(k): as_number(v) for k, v in (as_dict(d.get("parts_s")) or {}).items()},
        )

    def to_dict(self) -> JsonObject:
        loss = self.largest_loss
        return {
            "final": self.final,
            "wall_s": self.wall_s,
            "ettr": self.ettr,
            "productive_s": self.productive_s,
            "attempts": self.attempts,
            "interruptions": self.interruptions,
            "largest_loss": None if loss is None else {"part": loss.part, "seconds": loss.seconds},
            "parts_s": dict(self.parts_s),
        }


# ---- a stop every rank agreed on (node 0's stop agreement) -----------------------------


def stop_words(stop_at: int, script_step: int | None) -> str:
    """A stop step in words that say its numbering: "after 99 training step(s) of this
    run (script step 199)", the script's step only where the heartbeats tell it."""
    words = f"after {stop_at} training step(s) of this run"
    return words + (f" (script step {script_step})" if script_step is not None else "")


@status_block
@dataclass(frozen=True, slots=True)
class StopRequestedBlock:
    """``stop_requested``: the step every rank was asked to stop at, and why. The step
    counts the training steps this run's processes issued (``stop_at_step``), not the
    script's numbering; ``stop_at_script_step`` is the same step in the script's
    numbering where the heartbeats tell it (else null)."""

    name: ClassVar[str] = "stop_requested"

    stop_at_step: int | None = None
    reason: str | None = None
    stop_at_script_step: int | None = None

    @classmethod
    def from_dict(cls, raw: object) -> StopRequestedBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            as_int(d.get("stop_at_step")),
            as_str(d.get("reason")),
            as_int(d.get("stop_at_script_step")),
        )

    def to_dict(self) -> JsonObject:
        return {
            "stop_at_step": self.stop_at_step,
            "reason": self.reason,
            "stop_at_script_step": self.stop_at_script_step,
        }


# ---- the nodes of an elastic job (node 0's membership service) -------------------------


@dataclass(frozen=True, slots=True)
class ElasticMember:
    """A node of the current round: its number and its agent's id."""

    node: int | None
    agent: str | None


@dataclass(frozen=True, slots=True)
class SpareWaiting:
    """An agent waiting as a spare, since when (epoch seconds)."""

    agent: str | None
    since: float | None


@dataclass(frozen=True, slots=True)
class Replacement:
    """A spare that took a lost node's place: the round, the node, the spare's agent,
    the lost agent it replaced, how long it waited and when it joined."""

    round: str | None = None
    node: int | None = None
    spare: str | None = None
    replaced: str | None = None
    waited_s: float | None = None
    at: float | None = None

    @classmethod
    def from_dict(cls, raw: object) -> Replacement | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            round=as_str(d.get("round")),
            node=as_int(d.get("node")),
            spare=as_str(d.get("spare")),
            replaced=as_str(d.get("replaced")),
            waited_s=as_number(d.get("waited_s")),
            at=as_number(d.get("at")),
        )

    def to_dict(self) -> JsonObject:
        return {
            "round": self.round,
            "node": self.node,
            "spare": self.spare,
            "replaced": self.replaced,
            "waited_s": self.waited_s,
            "at": self.at,
        }


@status_block
@dataclass(frozen=True, slots=True)
class ElasticBlock:
    """``elastic``: the nodes of the current rendezvous round (of ``min_nodes`` to
    ``max_nodes``), the spares waiting, the spares gone, the agents lost and every
    replacement so far."""

    name: ClassVar[str] = "elastic"

    nodes: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    shrunk: bool = False
    round: str | None = None
    members: tuple[ElasticMember, ...] = ()
    spares_waiting: tuple[SpareWaiting, ...] = ()
    spares_gone: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    replacements: tuple[Replacement, ...] = ()

    @classmethod
    def from_dict(cls, raw: object) -> ElasticBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        members = (as_dict(m) for m in as_list(d.get("members")))
        spares = (as_dict(s) for s in as_list(d.get("spares_waiting")))
        replacements = (Replacement.from_dict(r) for r in as_list(d.get("replacements")))
        return cls(
            nodes=as_int(d.get("nodes")),
            min_nodes=as_int(d.get("min_nodes")),
            max_nodes=as_int(d.get("max_nodes")),
            shrunk=d.get("shrunk") is True,
            round=as_str(d.get("round")),
            members=tuple(
                ElasticMember(as_int(m.get("node")), as_str(m.get("agent")))
                for m in members
                if m is not None
            ),
            spares_waiting=tuple(
                SpareWaiting(as_str(s.get("agent")), as_number(s.get("since")))
                for s in spares
                if s is not None
            ),
            spares_gone=tuple(str(a) for a in as_list(d.get("spares_gone"))),
            lost=tuple(str(a) for a in as_list(d.get("lost"))),
            replacements=tuple(r for r in replacements if r is not None),
        )

    def to_dict(self) -> JsonObject:
        return {
            "nodes": self.nodes,
            "min_nodes": self.min_nodes,
            "max_nodes": self.max_nodes,
            "shrunk": self.shrunk,
            "round": self.round,
            "members": [{"node": m.node, "agent": m.agent} for m in self.members],
            "spares_waiting": [{"agent": s.agent, "since": s.since} for s in self.spares_waiting],
            "spares_gone": list(self.spares_gone),
            "lost": list(self.lost),
            "replacements": [r.to_dict() for r in self.replacements],
        }


# ---- stragglers (node 0's straggler detector) -----------------------------------------


@dataclass(frozen=True, slots=True)
class StragglerRow:
    """One rank's scores in a straggler report (its ``worst``/``best`` lists)."""

    rank: int | None = None
    node_rank: int | None = None
    hostname: str | None = None
    pid: int | None = None
    gpu: JsonObject | None = None
    compute_ms: float | None = None
    relative: float | None = None
    individual: float | None = None

    @classmethod
    def from_dict(cls, raw: object) -> StragglerRow | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            rank=as_int(d.get("rank")),
            node_rank=as_int(d.get("node_rank")),
            hostname=as_str(d.get("hostname")),
            pid=as_int(d.get("pid")),
            gpu=as_dict(d.get("gpu")),
            compute_ms=as_number(d.get("compute_ms")),
            relative=as_number(d.get("relative")),
            individual=as_number(d.get("individual")),
        )

    def to_dict(self) -> JsonObject:
        return {
            "rank": self.rank,
            "node_rank": self.node_rank,
            "hostname": self.hostname,
            "pid": self.pid,
            "gpu": self.gpu,
            "compute_ms": self.compute_ms,
            "relative": self.relative,
            "individual": self.individual,
        }


@dataclass(frozen=True, slots=True)
class StragglerScores:
    """A rank's two scores (``relative`` to the fastest rank, ``individual`` to its
    own best), None where that score is off."""

    relative: float | None = None
    individual: float | None = None


@status_block
@dataclass(frozen=True, slots=True)
class StragglersBlock:
    """``stragglers``: the latest straggler report (its number, what it scored, the
    ranks flagged and below the thresholds, the worst and best ranks, every rank's
    scores keyed by rank)."""

    name: ClassVar[str] = "stragglers"

    report: int | None = None
    source: str | None = None
    ranks: int | None = None
    best_compute_ms: float | None = None
    stragglers: list[int] = field(default_factory=list)
    below_threshold: list[int] = field(default_factory=list)
    worst: list[StragglerRow] = field(default_factory=list)
    best: list[StragglerRow] = field(default_factory=list)
    scores: dict[str, StragglerScores] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: object) -> StragglersBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        worst = (StragglerRow.from_dict(r) for r in as_list(d.get("worst")))
        best = (StragglerRow.from_dict(r) for r in as_list(d.get("best")))
        scores = {}
        for rank, value in (as_dict(d.get("scores")) or {}).items():
            s = as_dict(value)
            if s is not None:
                scores[str(rank)] = StragglerScores(
                    as_number(s.get("relative")), as_number(s.get("individual"))
                )
        return cls(
            report=as_int(d.get("report")),
            source=as_str(d.get("source")),
            ranks=as_int(d.get("ranks")),
            best_compute_ms=as_number(d.get("best_compute_ms")),
            stragglers=[r for r in as_list(d.get("stragglers")) if type(r) is int],
            below_threshold=[r for r in as_list(d.get("below_threshold")) if type(r) is int],
            worst=[r for r in worst if r is not None],
            best=[r for r in best if r is not None],
            scores=scores,
        )

    def to_dict(self) -> JsonObject:
        return {
            "report": self.report,
            "source": self.source,
            "ranks": self.ranks,
            "best_compute_ms": self.best_compute_ms,
            "stragglers": list(self.stragglers),
            "below_threshold": list(self.below_threshold),
            "worst": [r.to_dict() for r in self.worst],
            "best": [r.to_dict() for r in self.best],
            "scores": {
                k: {"relative": s.relative, "individual": s.individual}
                for k, s in self.scores.items()
            },
        }


# ---- preemption (node 0's preemption evaluator) ---------------------------------------


@dataclass(frozen=True, slots=True)
class PreemptBudget:
    """The grace budget: the grace window, the stop-step lead, the longest save seen
    (and where it was seen), and whether a save fits."""

    preempt_time_s: float | None = None
    lead_s: float | None = None
    save_s: float | None = None
    save_source: str | None = None
    fits: bool | None = None

    @classmethod
    def from_dict(cls, raw: object) -> PreemptBudget | None:
        d = as_dict(raw)
        if d is None:
            return None
        fits = d.get("fits")
        return cls(
            preempt_time_s=as_number(d.get("preempt_time_s")),
            lead_s=as_number(d.get("lead_s")),
            save_s=as_number(d.get("save_s")),
            save_source=as_str(d.get("save_source")),
            fits=fits if isinstance(fits, bool) else None,
        )

    def to_dict(self) -> JsonObject:
        return {
            "preempt_time_s": self.preempt_time_s,
            "lead_s": self.lead_s,
            "save_s": self.save_s,
            "save_source": self.save_source,
            "fits": self.fits,
        }


@status_block
@dataclass(frozen=True, slots=True)
class PreemptionBlock:
    """``preemption``: the grace budget and, once a preemption began (``active``), its
    signal, reason and stop step (``stop_at_step``: training steps of this run;
    ``stop_at_script_step``: the same step in the script's numbering where the
    heartbeats tell it), the processes killed at the grace limit, the script's step
    every rank saved (None if not every rank did), how many ranks saved it and what
    that means for the next run (or that training ended before the stop step)."""

    name: ClassVar[str] = "preemption"

    budget: PreemptBudget | None = None
    active: bool = False
    signal: str | None = None
    reason: str | None = None
    stop_at_step: int | None = None
    stop_at_script_step: int | None = None
    preempt_time_s: float | None = None
    terminated_pids: tuple[int, ...] = ()
    saved_step: int | None = None
    ranks_saved: int | None = None
    saved: str | None = None

    _ACTIVE_KEYS: ClassVar[tuple[str, ...]] = (
        "signal",
        "reason",
        "stop_at_step",
        "stop_at_script_step",
        "preempt_time_s",
        "terminated_pids",
        "saved_step",
        "ranks_saved",
        "saved",
    )

    @classmethod
    def from_dict(cls, raw: object) -> PreemptionBlock | None:
        d = as_dict(raw)
        if d is None:
            return None
        return cls(
            budget=PreemptBudget.from_dict(d.get("budget")),
            active=any(k in d for k in cls._ACTIVE_KEYS),
            signal=as_str(d.get("signal")),
            reason=as_str(d.get("reason")),
            stop_at_step=as_int(d.get("stop_at_step")),
            stop_at_script_step=as_int(d.get("stop_at_script_step")),
            preempt_time_s=as_number(d.get("preempt_time_s")),
            terminated_pids=tuple(p for p in as_list(d.get("terminated_pids")) if type(p) is int),
            saved_step=as_int(d.get("saved_step")),
            ranks_saved=as_int(d.get("ranks_saved")),
            saved=as_str(d.get("saved")),
        )

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"budget": None if self.budget is None else self.budget.to_dict()}
        if self.active:
            out.update(
                (k, list(v) if isinstance(v := getattr(self, k), tuple) else v)
                for k in self._ACTIVE_KEYS
            )
        return out
