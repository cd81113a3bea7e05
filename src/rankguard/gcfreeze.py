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
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup"]


def freeze_startup() -> None:
    """Everything alive now lives as long as the process: no collection walks it again."""
    gc.collect()  # what is garbage already is collected, not kept forever
    gc.freeze()
