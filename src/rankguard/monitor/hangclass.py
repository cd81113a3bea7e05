"""What kind of hang: from the ranks' places in their collectives (pure logic).

Every rank's heartbeat carries its ``collectives`` block (the flight recorder's newest
enqueued and completed collective per group, and the collective it has waited in for a
while: ``stuck``). Node 0 has every node's records (the relay brings them, with global
rank numbers), so it compares the whole job's ranks, not one node's:

``did_not_join``
    some ranks wait inside collective N of a group, others never enqueued it: those are
    named with the group, the collective and N.
``mismatch``
    every rank of the group is inside collective N, but not the same one (another
    operation or other input sizes): both sides are named.
``communication_stall``
    every rank of the group joined collective N and none completes it: the transfer
    itself hangs (a link, a switch, NCCL); the group and its ranks are named.
``compute_hang``
    no rank is inside any collective: the ranks hang in their own work.

None when a rank reports no block (no flight recorder) or the ranks' places say none of
these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.jsontypes import JsonObject

__all__ = ["HangClass", "HangKind", "classify"]


class HangKind(str, Enum):
    DID_NOT_JOIN = "did_not_join"
    MISMATCH = "mismatch"
    COMMUNICATION_STALL = "communication_stall"
    COMPUTE_HANG = "compute_hang"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


@dataclass(frozen=True, slots=True)
class HangClass:
    kind: HangKind
    group: str | None = None
    seq: int | None = None
    op: str | None = None  # the collective's operation, where a waiting rank named it
    missing: list[int] = field(default_factory=list)  # did not join
    waiting: list[int] = field(default_factory=list)  # inside the collective
    sides: dict[str, list[int]] = field(default_factory=dict)  # mismatch: what -> ranks

    @property
    def line(self) -> str:
        what = f"{self.op or 'collective'} #{self.seq} of process group {self.group}"
        if self.kind is HangKind.DID_NOT_JOIN:
            return (
                f"collectives: rank(s) {_ranks(self.missing)} did not join {what} "
                f"(rank(s) {_ranks(self.waiting)} wait in it)"
            )
        if self.kind is HangKind.MISMATCH:
            sides = "; ".join(f"rank(s) {_ranks(r)} in {w}" for w, r in self.sides.items())
            return f"collectives: mismatch at #{self.seq} of process group {self.group}: {sides}"
        if self.kind is HangKind.COMMUNICATION_STALL:
            return (
                f"collectives: communication stall: rank(s) {_ranks(self.waiting)} all "
                f"joined {what} and none completes it"
            )
        return "collectives: compute hang: no rank is inside a collective"

    def to_dict(self) -> JsonObject:
        return {
            "kind": self.kind.value,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "missing_ranks": list(self.missing),
            "waiting_ranks": list(self.waiting),
            "sides": {k: list(v) for k, v in self.sides.items()},
            "line": self.line,
        }


def classify(blocks: Mapping[int, CollectivesBlock | None]) -> HangClass | None:
    """The hang's kind from every live rank's block (rank -> block)."""
    if len(blocks) < 2 or any(b is None for b in blocks.values()):
        return None
    have = {r: b for r, b in blocks.items() if b is not None}
    names = sorted({g.group for b in have.values() for g in b.groups})
    for name in names:
        pos = {r: g for r, b in have.items() if (g := b.group(name)) is not None}
        newest = max(g.enqueued for g in pos.values())
        waiting = sorted(r for r, g in pos.items() if g.enqueued == newest and g.inside)
        if not waiting:
            continue
        stuck = {
            r: st
            for r in waiting
            if (st := have[r].stuck) is not None and st.group == name and st.seq == newest
        }
        named = {r: f"{st.op} {st.sizes}".strip() for r, st in stuck.items()}
        op = next((st.op for st in stuck.values()), None)
        missing = sorted(r for r, g in pos.items() if g.enqueued < newest)
        if missing:
            return HangClass(HangKind.DID_NOT_JOIN, name, newest, op, missing, waiting)
        if len(set(named.values())) > 1:
            sides: dict[str, list[int]] = {}
            for r, what in sorted(named.items()):
                sides.setdefault(what, []).append(r)
            return HangClass(HangKind.MISMATCH, name, newest, None, [], waiting, sides)
        if len(waiting) == len(pos):
            return HangClass(HangKind.COMMUNICATION_STALL, name, newest, op, [], waiting)
    if not any(b.inside for b in have.values()):
        return HangClass(HangKind.COMPUTE_HANG)
    return None
