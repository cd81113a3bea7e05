"""``--preload``'s fork server, started by the launcher before the job: the modules it
imports, the temp directory its Unix socket goes under, and its start.

Kept apart from :mod:`.run` (which imports torch elastic's agent, the node's services and
the monitor): what starts the fork server imports nothing but the standard library and
the name of the server's variable, so a process that starts one without launching a job
pays no torch import of its own.
"""

from __future__ import annotations

import os
import sys
import tempfile

from rankguard.launcher.forkserver_warm import IMPORTS_ENV
from rankguard.util.textsafe import safe_text

__all__ = ["PRELOAD_WITH", "module_found", "preload_modules", "start_fork_server"]


def _say(msg: str) -> None:
    print(f"[rankguard] {safe_text(msg)}", file=sys.stderr, flush=True)


# What a preloaded module's users import later anyway, at a cost of their own: every
# torch.optim optimizer imports torch._dynamo at its construction (as long as torch's own
# import on a loaded machine), so a rank forked with torch alone still paid it at every
# start and restart.
PRELOAD_WITH: dict[str, tuple[str, ...]] = {"torch": ("torch._dynamo",)}


def preload_modules(modules: tuple[str, ...]) -> list[str]:
    """The fork server's imports for ``--preload modules``, in order: each module, then
    what its users import later anyway (:data:`PRELOAD_WITH`), once each."""
    out = [m for name in modules for m in (name, *PRELOAD_WITH.get(name, ()))]
    return list(dict.fromkeys(out))


def module_found(name: str) -> bool:
    """Whether ``name`` can be imported, looked up without importing it. A dotted name is
    looked up on the file system, package by package, without running the packages'
    ``__init__``: ``importlib.util.find_spec("a.b")`` imports ``a`` first, and for
    ``lightning.pytorch`` that is the whole of Lightning (torchmetrics, transformers:
    7 s of CPU in the launcher, before the fork server imports it again). Where that
    walk does not find it (a package that makes its submodules at import, as ``os.path``),
    ``find_spec`` decides as before."""
    import importlib.machinery
    import importlib.util

    if name in sys.modules:
        return True
    head, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(head) if head else None
        for part in rest:
            locations = spec.submodule_search_locations if spec is not None else None
            if locations is None:
                spec = None
                break
            spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
        if spec is not None:
            return True
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def start_fork_server(modules: tuple[str, ...]) -> dict[str, str]:
    """``--preload``: start the fork server that imports ``modules`` once; every rank is
    then forked from it, at the first start and at each restart, instead of starting a
    new interpreter and importing torch again (about a second per restart here). With
    torch it also imports ``torch._dynamo``, which the script's optimizer would import.
    Returns the environment the server inherited (the launcher's, now): the variables
    the launcher sets or changes later reach each forked rank through torch elastic's
    per-worker environment (:class:`~rankguard.launcher.agent.RankguardAgent`).

    A missing module is an error, not a silent slow start: each one is looked up first.
    The imports themselves run in the server's last preload module
    (:mod:`.forkserver_warm`), each on its own: one that fails there is a warning, and
    the ranks import it themselves. The server is started now so that its imports
    overlap the launcher's own set-up; it inherits the launcher's environment as it is
    at this point (the rankguard variables and OMP_NUM_THREADS are already set)."""
    import multiprocessing
    import multiprocessing.forkserver

    for name in modules:
        if not module_found(name):
            raise ValueError(f"--preload: no module named {name!r}")
    # "__main__" first, as Python's own default: the forked ranks then do not re-run the
    # launcher's main module. Then the guard that ties the fork server to the launcher
    # (it dies with it, and so do the ranks), before the long imports.
    multiprocessing.set_forkserver_preload(
        [
            "__main__",
            "rankguard.launcher.forkserver_guard",
            "rankguard.launcher.worker",
            "rankguard.launcher.forkserver_warm",
        ]
    )
    short = _fork_server_tempdir()
    saved = tempfile.tempdir
    if short is not None:
        _say(
            f"--preload: the temp directory ({len(tempfile.gettempdir())} characters) is too "
            f"long for the fork server's Unix socket; its socket goes under {short}"
        )
        tempfile.tempdir = short  # where Python's fork server makes its socket's directory
    inherited = dict(os.environ)  # the server takes IMPORTS_ENV out of its own
    os.environ[IMPORTS_ENV] = ",".join(preload_modules(modules))
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as exc:
        raise ValueError(f"--preload: the fork server cannot start: {exc}") from exc
    finally:
        tempfile.tempdir = saved
        os.environ.pop(IMPORTS_ENV, None)
    _say(
        f"--preload {','.join(modules)}: ranks are forked from a fork server that imported "
        "them once (at start and at every restart)"
    )
    return inherited


#: a Unix socket's longest path (``sun_path`` less its terminating NUL)
_UNIX_PATH_MAX = 107
#: what Python's fork server adds to the temp directory for its socket
_FORK_SERVER_SOCKET = "/pymp-xxxxxxxx/listener-xxxxxxxx"


def _fork_server_tempdir() -> str | None:
    """A shorter directory for the fork server's socket when the temp directory
    (``TMPDIR``) is too long for a Unix socket's path (a batch scheduler's per-job
    directory can be); None when it will do. ValueError when no shorter one is usable."""
    tmp = tempfile.gettempdir()
    if len(os.fsencode(tmp + _FORK_SERVER_SOCKET)) <= _UNIX_PATH_MAX:
        return None
    for short in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            return short
    raise ValueError(
        f"--preload: the temp directory {tmp} ({len(tmp)} characters) is too long for the "
        f"fork server's Unix socket (at most {_UNIX_PATH_MAX - len(_FORK_SERVER_SOCKET)}) "
        "and neither /tmp, /var/tmp nor /dev/shm is writable: set TMPDIR to a shorter "
        "directory"
    )
