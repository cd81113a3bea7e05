"""The evidence every verdict reads of a rank, in one place: which phase it is busy in and
how long that phase may last, how long it has been without progress, and where it
stands in the sequence of collectives (inside one, behind its peers).

A new kind of evidence (native frames, per-rank arrival times) goes here, and the
verdicts that weigh it call it; none of them parses a record's blocks itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankguard.monitor.hangclass import frame_op
from rankguard.rank.timeline import (
    CHECKPOINT_PHASE,
    CLOSING_PHASE,
    EVAL_PHASE,
    RESTART_PHASE,
    SETUP_PHASE,
    TRAIN_PHASE,
)
from rankguard.rank.waitcall import WAIT_CALL
from rankguard.schema.blocks import InProcessBlock, read_block
from rankguard.schema.cadence import Cadence
from rankguard.schema.collectives import CollectivesBlock
from rankguard.schema.findings import FindingType
from rankguard.schema.frames import waits_in_collective
from rankguard.schema.records import HeartbeatRecord

if TYPE_CHECKING:
    from rankguard.monitor.rules import RankState

__all__ = [
    "OVERSTAYED",
    "RESUMED_PHASES",
    "TRAIN_PHASES",
    "behind_in_collectives",
    "busy",
    "checkpointing",
    "collective_call",
    "collectives",
    "in_collective",
    "own_timeout",
    "p2p_wait",
    "phase_timeout",
    "seq",
    "stall_age",
    "standby_wait",
]

#: A busy peer with one of these findings overstayed its phase: its waiters stay its victims.
OVERSTAYED = frozenset({FindingType.PROGRESS_TIMEOUT, FindingType.SECTION_TIMEOUT})
TRAIN_PHASES = (TRAIN_PHASE, "step")
RESUMED_PHASES = (*TRAIN_PHASES, SETUP_PHASE)  # where the clock restarts after eval


def collectives(state: RankState) -> CollectivesBlock | None:
    """The rank's ``collectives`` block (None: none, or one that does not validate),
    parsed once per record."""
    rec = state.record
    if rec is None:
        return None
    cached = state.collectives
    if cached is not None and cached[0] is rec:
        return cached[1]
    block = None
    if CollectivesBlock.name in rec.extra:
        try:
            block = read_block(rec, CollectivesBlock)
        except ValueError:
            block = None
    state.collectives = (rec, block)
    return block


def collective_call(state: RankState) -> str | None:
    """The ``torch.distributed`` collective call the rank's main frame is inside
    (``all_reduce``), by its latest record; None for any other frame (a collective that
    waits in C++ under its caller's frame names no operation)."""
    return frame_op(state.record.main_frame) if state.record is not None else None


def in_collective(state: RankState) -> bool:
    """Inside a collective: by the flight recorder's status (a collective enqueued, not
    completed: DDP's reducer and FSDP's hooks wait there in C++), else by the Python
    frame (a ``torch.distributed`` call), else by the native call that frame is in
    (``main_call``: ``wait``, a point-to-point request's ``Work.wait``, which gloo's
    flight recorder does not record). Worked out once per record."""
    rec = state.record
    if rec is None:
        return False
    if state.inside_of is rec:
        return state.inside
    block = collectives(state)
    inside = (block is not None and block.inside) or (
        waits_in_collective(rec.main_frame) or rec.extra.get("main_call") == WAIT_CALL
    )
    state.inside_of, state.inside = rec, inside
    return inside


def p2p_wait(state: RankState) -> bool:
    """Waiting for peers by the main frame (or the native call it is in) while the
    flight recorder shows the rank inside no collective: a point-to-point operation
    (gloo's sends and receives are not in the recorder)."""
    block = collectives(state)
    return not (block is not None and block.inside) and in_collective(state)


def behind_in_collectives(states: list[RankState]) -> list[int] | None:
    """The ranks of ``states`` behind in the sequence of collectives of a group, inside
    no collective of any group, while a rank of ``states`` has entered a later one of
    that group and waits in it; None when no group tells them apart (or a rank reports
    none).

    Each group is compared among the ranks that report it (a 2-D mesh's tensor- and
    data-parallel groups hold some of the ranks each), by its name. A rank behind but
    inside an earlier collective of the group waits as well (a broadcast completes on
    some ranks without the one that did not join), and so does a rank behind in one
    group while inside a collective of another: it waits there, on the rank at the end
    of the chain, which waits on no one and is the one returned; a rank waiting in a
    point-to-point operation (:func:`p2p_wait`) waits on a peer too."""
    if len(states) < 2:
        return None
    blocks: dict[int, CollectivesBlock] = {}
    for s in states:  # none without a block each (a job without the flight recorder)
        block = collectives(s)
        if block is None:
            return None
        blocks[s.rank] = block
    if len(blocks) < 2:
        return None
    p2p = {s.rank for s in states if p2p_wait(s)}  # waiting on a peer too
    have = {r: b for r, b in blocks.items() if b is not None}
    names = sorted({g.group for b in have.values() for g in b.groups})
    culprits: set[int] = set()
    for name in names:
        at = {r: p for r, b in have.items() if (p := b.group(name)) is not None}
        if len(at) < 2:
            continue
        newest = max(p.enqueued for p in at.values())
        waiting = [r for r, p in at.items() if p.enqueued == newest and p.inside]
        behind = [
            r for r, p in at.items() if p.enqueued < newest and not have[r].inside and r not in p2p
        ]
        if behind and waiting:
            culprits.update(behind)
    return sorted(culprits) if culprits else None


def busy(state: RankState) -> bool:
    """In a phase of its own (saving, evaluating, a user section), not training.
    Worked out once per record."""
    rec = state.record
    if rec is None:
        return False
    if state.busy_of is rec:
        return state.busy
    own = not rec.ended and (
        rec.checkpoint_active
        or (rec.phase or SETUP_PHASE) not in (SETUP_PHASE, TRAIN_PHASE, "step")
    )
    state.busy_of, state.busy = rec, own
    return own


def seq(state: RankState) -> int:
    """The rank's progress counter (steps completed), 0 before its first record."""
    return state.record.progress_seq if state.record is not None else 0


def stall_age(s: RankState, rec: HeartbeatRecord, now: float, age: float) -> float:
    """How long rank ``s`` has been without progress in its current phase: the clock
    restarts when train (or, before the first step, setup) resumes after eval or a save,
    and when heartbeats come back after a pause (SIGCONT); an evaluation before the first
    step counts from its own start, not from the process start."""
    if rec.checkpoint_active:
        pass
    elif rec.progress_seq <= 0 and busy(s):
        age = min(age, (rec.phase_elapsed_s or 0.0) + (now - (s.seen_at or now)))
    elif s.train_since is not None and rec.phase in RESUMED_PHASES:
        age = min(age, now - s.train_since)
    if s.resumed_at is not None:
        age = min(age, now - s.resumed_at)
    return age


def own_timeout(cadence: Cadence, phase: str) -> float:
    """A phase's timeout without section timeouts: eval's, the checkpoint timeout
    while the session closes, else the progress timeout."""
    if phase == EVAL_PHASE:
        return cadence.eval_timeout_s
    if phase == CLOSING_PHASE:
        return cadence.checkpoint_timeout_s
    return cadence.progress_timeout_s


def phase_timeout(cadence: Cadence, s: RankState) -> float:
    """How long rank ``s`` may stay in its current (non-train) phase."""
    rec = s.record
    assert rec is not None
    sections = cadence.sections
    if rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE:
        return cadence.checkpointing_timeout_s
    phase = rec.phase or ""
    if phase in sections:
        return max(sections[phase], standby_wait(rec) if phase == RESTART_PHASE else 0.0)
    if cadence.out_of_section_s is not None:
        return cadence.out_of_section_s
    return own_timeout(cadence, phase)


def standby_wait(rec: HeartbeatRecord) -> float:
    """How long a rank re-entering in-process may wait at its barrier for a lost peer's
    standby that is on its way (the barrier's own bound; 0 when it waits for none): a
    standby refilled a moment before the loss is still starting its interpreter."""
    try:
        block = read_block(rec, InProcessBlock)
    except ValueError:
        return 0.0
    return (block.awaiting_standby_s or 0.0) if block is not None else 0.0


def checkpointing(rec: HeartbeatRecord) -> bool:
    """Saving: the API's checkpoint, a save recognised on the stack, or the phase."""
    return rec.checkpoint_active or rec.phase == CHECKPOINT_PHASE
