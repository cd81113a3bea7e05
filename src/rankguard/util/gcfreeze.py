"""What a process holds before its work starts is kept out of the garbage collector's walks.

A rank imports torch (and rankguard) before the training script runs: about 177,000
objects that the cyclic collector walks at every full collection, for as long as the
process lives. Once the script's optimizer has imported ``torch._dynamo`` (117,000 more),
a full collection takes 164 ms on a 2-core machine, 69 ms with the first ones frozen
(``bench/gc_pause.py``): a pause no step time explains, at a moment no rank chooses, the
noise a straggler detector has to see through. At exit the interpreter walks them once
more (about 0.4 s of CPU per rank, paid again at every restart).

:func:`freeze_startup` moves every object alive at that moment to the collector's
permanent generation (``gc.freeze``, the interpreter's own means for it). Those objects
are module state that lives as long as the process. What the script makes afterwards is
collected as before, at exit too: an unclosed file is still flushed, a finalizer still
runs; freezing at the end instead would have left them to the operating system.

:func:`pause_collection` before the start-up imports (the launcher's and each rank's
``import torch``) spares the full collections the interpreter would start while the heap
grows through them, each a walk of everything imported so far: 0.12 s of CPU per process
start here, a tenth of it (``bench/gc_pause.py``). :func:`freeze_startup` then collects
once (the imports' garbage: about 7,000 objects) and turns collection back on, before any
of the user's code runs. This is the pattern the interpreter's documentation gives for
``gc.freeze``.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup", "pause_collection", "resume_collection"]

_paused = False  # collection is off because pause_collection turned it off


def pause_collection() -> None:
    """No automatic collection until :func:`freeze_startup` (or
    :func:`resume_collection`); nothing if collection is off already."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> None:
    """Collection back on if :func:`pause_collection` turned it off (a start-up that
    ends before :func:`freeze_startup`, an error line say)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def freeze_startup() -> None:
    """Everything alive now lives as long as the process: no collection walks it again."""
    gc.collect()  # what is garbage already is collected, not kept forever
    gc.freeze()
    resume_collection()
