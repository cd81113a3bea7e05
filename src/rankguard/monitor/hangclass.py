"""What kind of hang: from the ranks' places in their collectives (pure logic).

Every rank's heartbeat carries its ``collectives`` block (the flight recorder's newest
enqueued and completed collective per group, and the collective it has waited in for a
while: ``stuck``). Node 0 has every node's records (the relay brings them, with global
rank numbers), so it compares the whole job's ranks, not one node's:

``did_not_join``
    some ranks wait inside collective N of a group, others are behind it and inside no
    collective at all: those are named with the group, the first collective none of
    them joined and its number. A rank behind but inside an earlier collective is
    waiting, not missing: some collectives complete on part of the group without the
    rank that did not join (gloo's broadcast from rank 0 of 4 completes on ranks 0 and 2
    without rank 3, rank 1 waits in it), so their peers go on to the next one. So is a
    rank behind in one group while inside a collective of another (a 2-D mesh: rank 0
    waits in its tensor-parallel all-reduce for rank 1, stuck in compute, so it is
    behind in its data-parallel group, where rank 2 waits for it): the one named is
    the rank at the end of that chain, waiting on no one. Sequence numbers are compared
    only within one group (each group numbers its own collectives), by the group's
    name, the same on every rank.
``mismatch``
    every rank of the group is inside collective N, but not the same one (another
    operation or other input sizes): both sides are named.
``communication_stall``
    every rank of the group joined collective N and none completes it: the transfer
    itself hangs (a link, a switch, NCCL); the group and its ranks are named.
``point_to_point``
    no rank is inside a collective the flight recorder shows, and some ranks wait in a
    point-to-point operation by their main frame (a pipeline stage's ``recv``, or a
    request's native ``Work.wait``: torch 2.13 does not record gloo's sends and receives):
    the ranks outside any wait are the ones the others wait on (a stage stalled in its
    forward while its neighbours wait for its activations and gradients); none when
    every rank waits (sends and receives that deadlock, or a transfer that hangs).
``compute_hang``
    no rank is inside any collective nor waits in a point-to-point operation: the ranks
    hang in their own work.

None when a rank reports no block (no flight recorder) or the ranks' places say none of
these.

A rank that stopped publishing (its heartbeat timeout: stopped, swapping, cut off) is
compared by its last record (:func:`classify_silent`): it is still where that record
says. Only what holds while it stays there is said: every rank inside collective N, the
silent one included (a communication stall, or a mismatch), or the silent rank behind
and outside the group's collectives while its peers wait (it did not join). A silent
rank inside a collective its peers have not reached yet, or no rank inside any, says
nothing yet about a hang: no class.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.jsontypes import JsonObject

__all__ = ["COLLECTIVE_CALLS", "HangClass", "HangKind", "classify", "classify_silent", "frame_op"]

#: ``torch.distributed``'s collective calls, by the name of their Python function: a main
#: frame inside one (``distributed_c10d.py:<line> in all_reduce``) names the operation of
#: the collective the rank waits in, where no ``stuck`` named it yet
COLLECTIVE_CALLS = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
    }
)


@functools.lru_cache(maxsize=4096)  # a job's ranks share a few frames
def frame_op(frame: str | None) -> str | None:
    """The collective call a main frame is inside (``"distributed_c10d.py:3155 in
    all_reduce"`` -> ``all_reduce``), else None."""
    if not frame or not frame.startswith("distributed_c10d.py:"):
        return None
    _, _, func = frame.partition(" in ")
    return func if func in COLLECTIVE_CALLS else None


class HangKind(str, Enum):
    DID_NOT_JOIN = "did_not_join"
    MISMATCH = "mismatch"
    COMMUNICATION_STALL = "communication_stall"
    POINT_TO_POINT = "point_to_point"
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
    later: list[int] = field(default_factory=list)  # did not join: waiting in a later one
    silent: list[int] = field(default_factory=list)  # stopped publishing: by their last record
    # did not join: the other groups the same ranks did not join either (group, number)
    also: list[tuple[str, int]] = field(default_factory=list)

    def _waiting_where(self) -> str:
        """Who waits where, when ranks did not join."""
        at = [r for r in self.waiting if r not in self.later]
        later = f"rank(s) {_ranks(self.later)} in a later collective of the group"
        if not at:
            return later
        return f"rank(s) {_ranks(at)} wait in it" + (f", {later}" if self.later else "")

    @property
    def line(self) -> str:
        what = f"{self.op or 'collective'} #{self.seq} of process group {self.group}"
        silent = f"rank(s) {_ranks(self.silent)} stopped publishing"
        if self.kind is HangKind.DID_NOT_JOIN:
            line = (
                f"collectives: rank(s) {_ranks(self.missing)} did not join {what} "
                f"({self._waiting_where()})"
            )
            if self.also:
                line += ", nor " + ", ".join(f"#{n} of process group {g}" for g, n in self.also)
            return f"{line}; {silent}" if self.silent else line
        if self.kind is HangKind.MISMATCH:
            sides = "; ".join(f"rank(s) {_ranks(r)} in {w}" for w, r in self.sides.items())
            line = f"collectives: mismatch at #{self.seq} of process group {self.group}: {sides}"
            return f"{line}; {silent} inside it" if self.silent else line
        if self.kind is HangKind.COMMUNICATION_STALL:
            if self.silent:
                return (
                    f"collectives: communication stall: {silent} inside {what}, which "
                    f"rank(s) {_ranks(self.waiting)} all joined; none completes it"
                )
            return (
                f"collectives: communication stall: rank(s) {_ranks(self.waiting)} all "
                f"joined {what} and none completes it"
            )
        if self.kind is HangKind.POINT_TO_POINT:
            waits = f"rank(s) {_ranks(self.waiting)} wait in point-to-point operations"
            if not self.missing:
                return f"collectives: {waits}, every rank (none is outside a wait)"
            line = f"collectives: rank(s) {_ranks(self.missing)} in no wait; {waits}"
            return f"{line}; {silent}" if self.silent else line
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
            "later_ranks": list(self.later),
            "silent_ranks": list(self.silent),
            "also": [{"group": g, "seq": n} for g, n in self.also],
            "line": self.line,
        }


def _op(
    have: Mapping[int, CollectivesBlock],
    group: str,
    seq: int,
    ranks: list[int],
    calls: Mapping[int, str],
) -> str | None:
    """Collective ``seq`` of ``group``'s operation, as a rank waiting in it named it
    (``stuck``), else as the call a rank inside it as its group's newest is in (its main
    frame: the training thread waits in the collective it enqueued last)."""
    for r in ranks:
        st = have[r].stuck
        if st is not None and st.group == group and st.seq == seq:
            return st.op
    for r in ranks:
        g = have[r].group(group)
        if r in calls and g is not None and g.inside and g.enqueued == seq:
            return calls[r]
    return None


def classify(
    blocks: Mapping[int, CollectivesBlock | None],
    calls: Mapping[int, str] | None = None,
    p2p: Collection[int] = (),
) -> HangClass | None:
    """The hang's kind from every live rank's block (rank -> block); ``calls``: the
    collective call each rank's main frame is inside (rank -> ``all_reduce``), where
    known, to name an operation no ``stuck`` names; ``p2p``: the ranks whose main frame
    waits for peers outside any collective the recorder shows (point-to-point)."""
    calls = calls or {}
    if len(blocks) < 2 or any(b is None for b in blocks.values()):
        return None
    have = {r: b for r, b in blocks.items() if b is not None}
    names = sorted({g.group for b in have.values() for g in b.groups})
    found = None
    for name in names:
        pos = {r: g for r, b in have.items() if (g := b.group(name)) is not None}
        newest = max(g.enqueued for g in pos.values())
        waiting = sorted(r for r, g in pos.items() if g.enqueued == newest and g.inside)
        if not waiting:
            continue
        # Behind and outside any collective: did not join. A rank behind but inside an
        # earlier collective waits too: in one some peers could complete without the
        # rank that did not join (gloo's broadcast from rank 0 completes on rank 0 and 2
        # of 4 without rank 3, while rank 1 waits in it). So does a rank behind but
        # inside a collective of another group: it waits there on the rank that did not
        # join (that group's, or further down the chain: the one waiting on no one).
        # A rank waiting in a point-to-point operation waits on a peer as well.
        missing = sorted(
            r for r, g in pos.items() if g.enqueued < newest and not have[r].inside and r not in p2p
        )
        if missing:
            seq = max(pos[r].enqueued for r in missing) + 1  # none of them joined it
            if found is not None:  # the same ranks, missed in another group too
                if set(missing) <= set(found.missing):
                    found.also.append((name, seq))
                continue
            inside = sorted(r for r, g in pos.items() if g.inside)
            found = HangClass(
                HangKind.DID_NOT_JOIN,
                name,
                seq,
                _op(have, name, seq, inside, calls),
                missing,
                inside,
                later=[r for r in inside if pos[r].enqueued > seq],
            )
            continue
        if found is not None:
            continue
        stuck = {
            r: st
            for r in waiting
            if (st := have[r].stuck) is not None and st.group == name and st.seq == newest
        }
        named = {r: f"{st.op} {st.sizes}".strip() for r, st in stuck.items()}
        op = next((st.op for st in stuck.values()), None) or _op(have, name, newest, waiting, calls)
        if len(waiting) < len(pos):
            continue  # every rank behind waits in an earlier collective: no one kind
        if len(set(named.values())) > 1:
            sides: dict[str, list[int]] = {}
            for r, what in sorted(named.items()):
                sides.setdefault(what, []).append(r)
            return HangClass(HangKind.MISMATCH, name, newest, None, [], waiting, sides)
        return HangClass(HangKind.COMMUNICATION_STALL, name, newest, op, [], waiting)
    if found is not None:
        return found
    if any(b.inside for b in have.values()):
        return None
    waits = sorted(r for r in p2p if r in have)
    if waits:
        outside = sorted(r for r in have if r not in waits)
        return HangClass(HangKind.POINT_TO_POINT, missing=outside, waiting=waits)
    return HangClass(HangKind.COMPUTE_HANG)


def classify_silent(
    blocks: Mapping[int, CollectivesBlock | None],
    silent: list[int],
    calls: Mapping[int, str] | None = None,
    p2p: Collection[int] = (),
) -> HangClass | None:
    """The hang's kind with ranks ``silent`` compared by their last record (they
    stopped publishing), or None where that says nothing about a hang while they stay
    there (see the module's docstring)."""
    got = classify(blocks, calls, p2p)
    if got is None or not silent:
        return None
    if got.kind in (HangKind.DID_NOT_JOIN, HangKind.POINT_TO_POINT):
        if not set(silent) & set(got.missing):
            return None  # the silent rank waits for peers that may still come
    elif got.kind is HangKind.COMPUTE_HANG:
        return None  # its peers may be working on
    return replace(got, silent=sorted(silent))
