"""Which native call the training thread's innermost Python frame is in, by its bytecode.

A rank's ``main_frame`` names the innermost *Python* frame. A pipeline stage waiting for
its neighbour in ``dist.irecv(...).wait()``, ``batch_isend_irecv``'s requests, torch's
pipelining schedules (``_wait_batch_p2p``) or Megatron's ``p2p_communication.py`` waits
in C++ (``Work.wait``) under a frame of its caller, and gloo's point-to-point operations
are not in torch's flight recorder (torch 2.13 records gloo's collectives only): from the
frame alone such a stage looks like one stalled in its own code. The instruction the
frame is executing says what it called: the call's name, read from the instruction that
loaded the callable (``w.wait()``: ``LOAD_METHOD wait``, ``time.sleep(1)``: ``LOAD_ATTR
sleep``). A Python ``wait`` (``threading.Event.wait``) has a frame of its own, so the
innermost frame at a call of ``wait`` is in a native one: torch's ``Work.wait`` or
``Future.wait``.

Read on the heartbeat thread from the frame it samples anyway, nothing on the training
thread: a frame not at a call costs one byte read; one at a call decodes its code object
once (cached: the 256 latest code objects, the 4,096 latest call sites).
"""

from __future__ import annotations

import dis
import functools
from types import CodeType, FrameType

__all__ = ["WAIT_CALL", "native_call"]

#: the name of a native call that waits for peers (torch's ``Work.wait``, ``Future.wait``)
WAIT_CALL = "wait"

_CALLS = frozenset(
    {"CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_KW", "PRECALL"}
)
_SKIP = frozenset({"PRECALL", "KW_NAMES", "CACHE", "PUSH_NULL", "NOP"})
_ONE_PUSH = frozenset({"LOAD_FAST", "LOAD_CONST", "LOAD_DEREF", "LOAD_NAME", "LOAD_SMALL_INT"})
_CALLABLE = frozenset({"LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME"})
_MAX_NAME = 64


def native_call(frame: FrameType | None) -> str | None:
    """The name of what ``frame`` calls right now (``wait``, ``sleep``), when its
    instruction is a call whose callable and arguments are simple loads; None otherwise
    (a frame between instructions, a call built from nested expressions)."""
    if frame is None:
        return None
    return _call_at(frame.f_code, frame.f_lasti)


def _call_at(code: CodeType, lasti: int) -> str | None:
    raw = code.co_code
    if not 0 <= lasti < len(raw) or dis.opname[raw[lasti]] not in _CALLS:
        return None  # not at a call: nothing decoded
    return _call_name(code, lasti)


@functools.lru_cache(maxsize=256)
def _decoded(code: CodeType) -> tuple[dict[int, int], list[dis.Instruction]]:
    """A code object's instructions and each one's index by offset: decoded once."""
    ins = list(dis.get_instructions(code))
    return {x.offset: i for i, x in enumerate(ins)}, ins


@functools.lru_cache(maxsize=4096)
def _call_name(code: CodeType, lasti: int) -> str | None:
    index, ins = _decoded(code)
    at = index.get(lasti)
    if at is None or ins[at].opname not in _CALLS:
        return None
    arg = ins[at].arg
    argc = arg if isinstance(arg, int) else 0
    if ins[at].opname in ("CALL_FUNCTION_KW", "CALL_KW"):
        argc += 1  # the keywords' names, a constant tuple
    i = at - 1
    while i >= 0 and ins[i].opname in _SKIP:
        i -= 1
    for _ in range(argc):  # each argument one simple load, else the callable is unknown
        if i < 0 or ins[i].opname not in _ONE_PUSH:
            return None
        i -= 1
        while i >= 0 and ins[i].opname in _SKIP:
            i -= 1
    if i < 0 or ins[i].opname not in _CALLABLE or not isinstance(ins[i].argval, str):
        return None
    name = ins[i].argval
    return name if 0 < len(name) <= _MAX_NAME else None
