"""The flight-recorder verdict: what kind of hang the ranks' traces show (pure logic).

The traces (rank -> torch's JSON dump, read as data; every node's, under the job's rank
numbers) are compared per process group, from each rank's ``pg_status`` (its newest
enqueued and completed collective) and its entries (each collective's operation and
input sizes):

``did_not_join``
    some ranks are behind the group's newest collective and inside none of its
    collectives (or never used the group), nor waiting in a point-to-point operation
    (``compare``'s ``waiting``: gloo records none): they are named with the first collective
    none of them joined and its sequence number; every rank inside a collective of the
    group waits. A rank behind but inside an earlier collective waits too: gloo's
    broadcast from rank 0 of 4 completes on ranks 0 and 2 without rank 3, rank 1 waits
    in it, and ranks 0 and 2 go on to the next collective.
``mismatch``
    every rank of the group is inside its newest collective, but not the same one
    (another operation or other input sizes): both sides are named.
``communication_stall``
    every rank of the group is inside the same newest collective and none completes it:
    the group and its ranks are named.

A mismatch and a communication stall are said only when every rank of the job was read.

None when no group shows any of these (no collective involved: the heartbeats'
collectives line then says compute hang).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rankguard.ft.collectives import names_in, seq_number
from rankguard.monitor.hangclass import HangKind
from rankguard.schema.coerce import as_str
from rankguard.schema.jsontypes import JsonInput, JsonObject

__all__ = ["FrVerdict", "compare"]

_MAX_TEXT = 200
_KINDS = (HangKind.DID_NOT_JOIN, HangKind.MISMATCH, HangKind.COMMUNICATION_STALL)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


@dataclass(frozen=True, slots=True)
class FrVerdict:
    """The kind of hang the ranks' flight-recorder traces show, and who is where."""

    process_group: str
    collective: str  # e.g. "all_reduce" (backend prefix removed)
    seq: int  # the collective's sequence number in its group
    missing_ranks: list[int]  # ranks that never enqueued it
    waiting_ranks: list[int]  # ranks inside a collective of the group, waiting
    ranks_read: list[int]
    kind: HangKind = HangKind.DID_NOT_JOIN
    later_ranks: list[int] = field(default_factory=list)  # waiting in a later collective
    sides: dict[str, list[int]] = field(default_factory=dict)  # mismatch: what -> ranks
    torch_analysis: str | None = None  # torchfrtrace's output (or why it failed)
    extra: JsonObject = field(default_factory=dict)

    @property
    def line(self) -> str:
        what = f"{self.collective} #{self.seq} of process group {self.process_group}"
        if self.kind is HangKind.MISMATCH:
            sides = "; ".join(f"rank(s) {_ranks(r)} in {w}" for w, r in self.sides.items())
            return (
                f"flight recorder: mismatch at #{self.seq} of process group "
                f"{self.process_group}: {sides}"
            )
        if self.kind is HangKind.COMMUNICATION_STALL:
            return (
                f"flight recorder: communication stall: rank(s) {_ranks(self.waiting_ranks)} "
                f"all joined {what} and none completes it"
            )
        at = [r for r in self.waiting_ranks if r not in self.later_ranks]
        where = [f"rank(s) {_ranks(at)} wait in it"] if at else []
        if self.later_ranks:
            where.append(f"rank(s) {_ranks(self.later_ranks)} in a later collective of the group")
        others = f" ({', '.join(where)})" if where else ""
        return f"flight recorder: rank(s) {_ranks(self.missing_ranks)} did not join {what}{others}"

    def to_dict(self) -> JsonObject:
        return {
            "kind": self.kind.value,
            "process_group": self.process_group,
            "collective": self.collective,
            "seq": self.seq,
            "missing_ranks": list(self.missing_ranks),
            "waiting_ranks": list(self.waiting_ranks),
            "later_ranks": list(self.later_ranks),
            "sides": {k: list(v) for k, v in self.sides.items()},
            "ranks_read": list(self.ranks_read),
            "torch_analysis": self.torch_analysis,
            "line": self.line,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: JsonInput) -> FrVerdict:
        texts: dict[str, str] = {}
        for key in ("process_group", "collective"):
            text = as_str(d.get(key))
            if text is None:
                raise ValueError(f"{key}: expected a string")
            texts[key] = text
        seq = d.get("seq")
        if type(seq) is not int:
            raise ValueError("seq: expected an integer")
        lists: dict[str, list[int]] = {}
        for key in ("missing_ranks", "waiting_ranks", "ranks_read", "later_ranks"):
            value = d.get(key, [] if key == "later_ranks" else None)
            if not isinstance(value, list) or not all(type(r) is int for r in value):
                raise ValueError(f"{key}: expected a list of ranks")
            lists[key] = value
        kind = d.get("kind", HangKind.DID_NOT_JOIN.value)
        if kind not in [k.value for k in _KINDS]:
            raise ValueError(f"kind: expected one of {', '.join(k.value for k in _KINDS)}")
        sides = d.get("sides", {})
        if not isinstance(sides, dict) or not all(
            isinstance(v, list) and all(type(r) is int for r in v) for v in sides.values()
        ):
            raise ValueError("sides: expected an object of lists of ranks")
        ta = d.get("torch_analysis")
        return cls(
            process_group=texts["process_group"],
            collective=texts["collective"],
            seq=seq,
            missing_ranks=lists["missing_ranks"],
            waiting_ranks=lists["waiting_ranks"],
            ranks_read=lists["ranks_read"],
            kind=HangKind(kind),
            later_ranks=lists["later_ranks"],
            sides={str(k): list(v) for k, v in sides.items()},
            torch_analysis=ta if isinstance(ta, str) else None,
        )


def _int(value: Any) -> int:
    """A sequence number from a trace; -1 for anything else."""
    seq = seq_number(value)
    return -1 if seq is None else seq


@dataclass(slots=True)
class _Positions:
    """Every rank's place in every group (by the group's name: ``pg_status`` is keyed by
    the group's id on each rank, which names another group on another rank), what each
    rank recorded per collective, the ranks inside a collective of any group, and who
    belongs to which group where the traces say it (the world group; ``pg_config``)."""

    enqueued: dict[str, dict[int, int]] = field(default_factory=dict)
    completed: dict[str, dict[int, int]] = field(default_factory=dict)
    ops: dict[tuple[int, str, int], tuple[str, str]] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)  # inside a collective of some group
    world: set[str] = field(default_factory=set)  # the default group's name(s)
    members: dict[str, set[int]] = field(default_factory=dict)  # pg_config's ranks

    @classmethod
    def read(cls, traces: dict[int, JsonObject]) -> _Positions:
        out = cls()
        for rank, doc in traces.items():
            names = names_in(doc)
            status = doc.get("pg_status")
            for pid, st in (status if isinstance(status, dict) else {}).items():
                if isinstance(st, dict):
                    group = names.get(str(pid), str(pid))
                    enq = _int(st.get("last_enqueued_collective"))
                    out.enqueued.setdefault(group, {})[rank] = enq
                    done = _int(st.get("last_completed_collective"))
                    out.completed.setdefault(group, {})[rank] = done
                    if done < enq:
                        out.busy.add(rank)
            entries = doc.get("entries")
            for e in entries if isinstance(entries, list) else []:
                if isinstance(e, dict) and not e.get("is_p2p"):
                    name = e.get("process_group")
                    pg = str(name[0]) if isinstance(name, (list, tuple)) else str(e.get("pg_id"))
                    if isinstance(name, (list, tuple)) and name[1:2] == ["default_pg"]:
                        out.world.add(pg)
                    op = str(e.get("profiling_name")).split(":", 1)[-1][:_MAX_TEXT]
                    sizes = json.dumps(e.get("input_sizes"), separators=(",", ":"))[:_MAX_TEXT]
                    out.ops[(rank, pg, _int(e.get("collective_seq_id")))] = (op, sizes)
            out._read_config(doc.get("pg_config"))
        return out

    def _read_config(self, config: Any) -> None:
        """``pg_config``: name -> its ranks (``"[0, 1]"``), where the backend records it."""
        for name, cfg in (config if isinstance(config, dict) else {}).items():
            text = cfg.get("ranks") if isinstance(cfg, dict) else None
            if not name or not isinstance(text, str) or len(text) > 100_000:
                continue
            with contextlib.suppress(ValueError):
                ranks = json.loads(text)
                if isinstance(ranks, list) and all(type(r) is int for r in ranks):
                    self.members.setdefault(str(name), set()).update(ranks)

    def absent(self, pg: str, read: list[int]) -> list[int]:
        """Ranks read that belong to ``pg`` (the world group's, or ``pg_config``'s) and
        never used it; a rank of another group only is not one of them."""
        seqs = self.enqueued[pg]
        if pg in self.world:
            return [r for r in read if r not in seqs]
        return [r for r in read if r not in seqs and r in self.members.get(pg, ())]

    def op(self, pg: str, seq: int, ranks: list[int]) -> str:
        for rank in ranks:
            got = self.ops.get((rank, pg, seq))
            if got is not None:
                return got[0]
        return "unknown collective"


def compare(
    traces: dict[int, JsonObject],
    *,
    world: int | None = None,
    waiting: Collection[int] = (),
) -> FrVerdict | None:
    """The verdict from the ranks' traces (rank -> trace), None when no group shows a
    hang's kind (see the module's docstring). A mismatch or a communication stall only
    from the traces of all ``world`` ranks of the job: a rank not read (stopped, or its
    node did not answer) may be the one that did not join. ``waiting``: ranks known to
    wait on a peer outside the traces (a pipeline stage in a point-to-point receive,
    which gloo does not record, by its heartbeat): never named as not joining."""
    pos = _Positions.read(traces)
    pos.busy.update(waiting)
    read = sorted(traces)
    for pg in sorted(pos.enqueued):
        verdict = _did_not_join(pos, pg, read)
        if verdict is not None:
            return verdict
    if world is None or len(read) < max(2, world):
        return None
    for pg in sorted(pos.enqueued):
        verdict = _all_inside(pos, pg, read)
        if verdict is not None:
            return verdict
    return None


def _did_not_join(pos: _Positions, pg: str, read: list[int]) -> FrVerdict | None:
    seqs, done = pos.enqueued[pg], pos.completed[pg]
    newest = max(seqs.values())
    inside = sorted(r for r, s in seqs.items() if done.get(r, -1) < s)
    if not inside:
        return None  # no rank of the group waits in it
    # behind, or a member that never used the group, and inside no collective of any
    # group: a rank inside another group's collective waits there, on the rank at the
    # end of that chain (the one waiting on no one), named by its own group
    behind = [r for r, s in seqs.items() if s < newest and r not in pos.busy]
    missing = sorted(behind + [r for r in pos.absent(pg, read) if r not in pos.busy])
    if not missing:
        return None
    seq = max(seqs[r] for r in behind) + 1 if behind else newest  # none of them joined it
    return FrVerdict(
        process_group=pg,
        collective=pos.op(pg, seq, sorted(seqs)),
        seq=seq,
        missing_ranks=missing,
        waiting_ranks=inside,
        ranks_read=read,
        later_ranks=[r for r in inside if seqs[r] > seq],
    )


def _all_inside(pos: _Positions, pg: str, read: list[int]) -> FrVerdict | None:
    """Every rank of the group inside the same newest collective: a mismatch when they
    recorded different operations or sizes for it, else a communication stall."""
    seqs, done = pos.enqueued[pg], pos.completed[pg]
    newest = max(seqs.values())
    ranks = sorted(seqs)
    if newest < 0 or any(seqs[r] != newest or done.get(r, -1) >= newest for r in ranks):
        return None
    what = {r: " ".join(got) for r in ranks if (got := pos.ops.get((r, pg, newest)))}
    sides: dict[str, list[int]] = {}
    for r, w in sorted(what.items()):
        sides.setdefault(w, []).append(r)
    mismatch = len(sides) > 1
    return FrVerdict(
        process_group=pg,
        collective=" / ".join(sorted({w.split(" ", 1)[0] for w in sides}))
        if mismatch
        else pos.op(pg, newest, ranks),
        seq=newest,
        missing_ranks=[],
        waiting_ranks=ranks,
        ranks_read=read,
        kind=HangKind.MISMATCH if mismatch else HangKind.COMMUNICATION_STALL,
        sides=sides if mismatch else {},
    )
