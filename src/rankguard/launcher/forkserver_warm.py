"""The last of ``--preload``'s fork server's preload modules: it imports the modules the
launcher names (the user's ``--preload`` list, then what their users import later
anyway: ``torch._dynamo`` for torch, which every ``torch.optim`` optimizer imports at its
construction), checks that the server is still fit to fork ranks, and freezes what it
holds for the collector.

Each import is tried on its own: one that fails is one warning line on the launcher's
stderr, and the ranks import that module themselves (Python's fork server skips a preload
module that raises ``ImportError`` without a word, and dies on any other error, which
failed the launch).

Fit to fork: one thread besides torch's own intra-op pool (a thread started by an import
holds no lock in the forked rank only if there is none), CUDA not initialized (a rank
forked from a process that initialized it cannot use it); either is said, not fixed.
Nothing of the user's script is imported here, only modules named on the command line.

The collector: the server's imports run with automatic collection off (the guard module
turns it off first: :mod:`rankguard.launcher.forkserver_guard`), and what they left is
moved to the permanent generation (``gc.freeze``) before the first fork. A forked rank's
own start-up collection (:func:`rankguard.util.gcfreeze.freeze_startup`) then walks only
what the rank made since, not the 290,000 objects of torch and ``torch._dynamo``: the
pattern Python's documentation gives for ``gc.freeze`` before ``fork``.

The launcher names the modules in :data:`IMPORTS_ENV`, in the server's environment only:
the server takes it out of its own before any rank is forked. Imported anywhere else
(the variable not set), this module does nothing.
"""

from __future__ import annotations

import importlib
import os
import sys

from rankguard.util.gcfreeze import freeze_startup

__all__ = ["IMPORTS_ENV", "server_threads", "warm"]

#: the fork server's imports, comma-separated, in order (set by the launcher)
IMPORTS_ENV = "RANKGUARD_FORK_SERVER_IMPORTS"


def _say(line: str) -> None:
    print(f"[rankguard] --preload: {line}", file=sys.stderr, flush=True)


def server_threads() -> int:
    """This process's threads (``/proc/self/task``); 1 where it cannot be read."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


def warm(names: list[str]) -> list[str]:
    """Import ``names`` in order, check the process is fit to fork, freeze its objects;
    the warning lines said (one per failed import, one per unfit state)."""
    said: list[str] = []
    own = 1  # the threads the server may run: its own, and torch's intra-op pool
    for name in names:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # a module's exit too: not the server's
            said.append(
                f"the fork server could not import {name} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); each rank imports it itself"
            )
        if name == "torch":
            # torch's import starts its OpenMP intra-op pool's thread where
            # OMP_NUM_THREADS is not 1 (a job of one rank per node, or a user's
            # setting): torch's own, and a rank forked from it computes in parallel
            # as one started afresh does; it is no sign of an unfit server
            own = max(own, server_threads())
    threads = server_threads()
    if threads > own:
        said.append(
            f"the fork server runs {threads} threads after its imports ({', '.join(names)}): "
            "a rank forked from it may inherit a lock held by one of them and hang; "
            "leave the module that starts them out of --preload"
        )
    if _cuda_initialized():
        said.append(
            "CUDA was initialized in the fork server by its imports "
            f"({', '.join(names)}): ranks forked from it cannot use CUDA; leave the module "
            "that initializes it out of --preload"
        )
    freeze_startup()  # what the imports left: no collection in any rank walks it again
    for line in said:
        _say(line)
    return said


def _from_environ() -> None:
    raw = os.environ.pop(IMPORTS_ENV, None)  # the ranks forked from here never see it
    if raw is None:
        return
    warm([name for name in raw.split(",") if name])


_from_environ()
