"""Rank bootstrap: ``python -m rankguard.launcher.worker [-m] TARGET [ARGS...]``.

The launcher starts every rank through this module. Before running the user's script
(or module) exactly as ``python script.py`` would, it starts the rank's heartbeat
session and installs the global optimizer-step hook, so a script that never imports
rankguard still publishes liveness and progress. Afterwards it records how the script
ended (clean, exit code, exception) in ``process_end``; ``@record`` writes the
traceback to torch elastic's per-rank error file so the launcher can name the root
cause.

A rank dies with its launcher (:mod:`rankguard.rank.lifeline`): the bootstrap sets
the parent-death signal before anything else, checks the parent did not die before that,
and hands the heartbeat thread the lifeline it checks at every beat.

A rank's own children die with it (:func:`guard_process_group`): torch elastic starts
each rank as the leader of a process group of its own (a rank forked by ``--preload``'s
fork server makes itself one), and the processes the script
starts (``subprocess``, ``os.system``, multiprocessing) stay in it. A small guard process
in that group gets a signal from the kernel when the rank ends, however it ends (a
normal end, a crash, the SIGKILL it gets when its launcher is SIGKILLed), and SIGKILLs
the group. torch elastic signals the group only while the rank itself is alive.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
import types
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankguard.util.gcfreeze import freeze_startup, pause_collection

if __name__ == "__main__":
    # torch's import ahead: collected once by freeze_startup, before the script runs
    pause_collection()

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from rankguard.bootstrap import session_from_env
from rankguard.config import run_config
from rankguard.ft.collectives import CollectiveSampler
from rankguard.ft.flightrec import TraceDumper
from rankguard.ft.stacks import install_dump_handler
from rankguard.launcher.standby import StandbySession
from rankguard.live.roles import rewrite_environ
from rankguard.rank import runenv
from rankguard.rank.lifeline import Lifeline, end_orphan, set_parent_death_signal
from rankguard.session import install

if TYPE_CHECKING:
    from rankguard.integrations.nvrx import RankMonitorBridge
    from rankguard.rank.ranksession import RankSession

__all__ = ["forked_main", "main", "run_path_main"]


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def hold_launcher(*, direct_child: bool) -> Lifeline | None:
    """Tie this rank to its launcher (None outside ``rankguard run``): the kernel kills
    it when its parent exits, and if the parent is already gone (it died before the
    signal was set) the rank stops now. ``direct_child``: the launcher started this
    process itself (else ``--preload``'s fork server did)."""
    lifeline = Lifeline.from_env(direct_child=direct_child)  # the parent before the prctl
    if lifeline is None:
        return None
    set_parent_death_signal(signal.SIGKILL)
    reason = lifeline.lost()
    if reason is not None:
        end_orphan(reason)
    return lifeline


# The guard: blocks GUARD_SIGNAL, asks for it at its parent's death, and when it comes
# (or the parent is already gone) SIGKILLs its process group: the rank's. It ignores the
# stop signals torch elastic sends the whole group, so it outlives the rank's own
# handling of them. It acts only in a group whose leader is the rank.
GUARD_SIGNAL = signal.SIGRTMIN + 4
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "rank, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,"
    " signal.SIGUSR1, signal.SIGUSR2):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {sig})\n"
    "if os.getpgid(0) != rank:\n"
    "    sys.exit(0)\n"
    "if ctypes.CDLL(None).prctl(1, sig, 0, 0, 0) == 0 and os.getppid() == rank:\n"
    "    signal.sigwait({sig})\n"
    "os.killpg(rank, signal.SIGKILL)\n"
)


def guard_process_group() -> subprocess.Popen[bytes] | None:
    """Start the guard of this rank's process group (see the module doc): only on Linux,
    when this process leads its group (torch elastic's subprocess start, and a rank
    forked by ``--preload``'s fork server: :func:`forked_main`). None when not
    started."""
    pid = os.getpid()
    if not sys.platform.startswith("linux") or os.getpgid(0) != pid:
        return None
    keep = {k: v for k, v in os.environ.items() if k in ("RANKGUARD_RUN_ID", "PATH")}
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", _GUARD, str(pid), str(int(GUARD_SIGNAL))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=keep,
        )
    except OSError:
        return None


def _serve_nvrx(session: RankSession, env: runenv.RunEnv) -> RankMonitorBridge | None:
    """NVRx's RankMonitorClient served in this rank when nvidia-resiliency-ext is
    installed (``fault_tolerance.serve_nvrx_client``; see ``integrations/nvrx.py``)."""
    cfg = run_config(env)
    if not session.enabled or cfg is None:
        return None
    from rankguard.integrations.nvrx import serve_nvrx_client

    bridge = serve_nvrx_client(
        session,
        cfg.fault_tolerance,
        cfg.heartbeat,
        rank=env.rank,
        enabled=cfg.fault_tolerance.serve_nvrx_client,
    )
    if bridge is not None:
        session.add_heartbeat_block(bridge.heartbeat_block)
    return bridge


def _as_main(code: types.CodeType, **attrs: Any) -> None:
    """Run ``code`` in a new ``__main__`` module, as the interpreter runs a script: the
    module stays ``sys.modules["__main__"]`` until the exit, which clears it after the
    atexit handlers (a file the script left open is flushed then, its objects' finalizers
    run). ``runpy``'s temporary module is put back at once, and what it held was left in
    reference cycles that no exit collects: a log the script never closed lost its tail."""
    module = types.ModuleType("__main__")
    module.__dict__.update(attrs, __builtins__=builtins)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _run_path_as_main(path: str) -> None:
    """``python SCRIPT``: a file is compiled and run as ``__main__``; a directory or zip
    file with a ``__main__.py`` runs through ``runpy`` as before."""
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(path, run_name="__main__")
        return
    path = os.path.abspath(path)  # as the interpreter's own ``__file__`` is
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    _as_main(code, __file__=path, __cached__=None, __loader__=loader, __spec__=None)


def _run_module_as_main(name: str) -> None:
    """``python -m NAME``: the module (a package's ``__main__``) run as ``__main__``,
    ``sys.argv[0]`` its file, as the interpreter's ``-m`` does."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
        runpy.run_module(name, run_name="__main__", alter_sys=True)  # runpy's own error
        return
    code = spec.loader.get_code(spec.name)
    if code is None:
        raise ImportError(f"No code object available for {name}")
    if spec.origin:
        sys.argv[0] = spec.origin
    _as_main(
        code,
        __file__=spec.origin,
        __cached__=spec.cached,
        __loader__=spec.loader,
        __spec__=spec,
        __package__=spec.parent,
    )


def _launcher_frame(tb: types.TracebackType) -> bool:
    name = tb.tb_frame.f_code.co_filename
    return name == __file__ or name in ("<frozen runpy>", runpy.__file__)


def script_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from the script's first frame: the frames of this bootstrap (and of
    ``runpy`` and torch's ``@record`` wrapper around it) that ``python script.py``
    would not have are left out. ``tb`` as it is when no frame of the script is in it
    (an error in the bootstrap itself)."""
    start, last = None, None
    t = tb
    while t is not None:
        if t.tb_frame.f_code.co_filename == __file__:
            last = t
        t = t.tb_next
    if last is not None:
        start = last.tb_next
        while start is not None and _launcher_frame(start):
            start = start.tb_next
    return start if start is not None else tb


def format_script_error(exc: BaseException) -> str:
    """The traceback of ``exc`` as the script alone would have printed it."""
    tb = script_traceback(exc.__traceback__)
    return "".join(traceback.format_exception(type(exc), exc, tb))


class ScriptErrorHandler(ErrorHandler):
    """torch elastic's error handler (``@record``) writing the traceback from the
    script's first frame into the rank's error file, in torch's format: the launcher's
    summary and torchrun's ``ChildFailedError`` block show the script's frames only."""

    def record_exception(self, e: BaseException) -> None:
        file = self._get_error_file_path()
        if not file:
            return
        data = {
            "message": {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {
                    "py_callstack": format_script_error(e),
                    "timestamp": str(int(time.time())),
                },
            }
        }
        self._write_error_file(file, json.dumps(data))


def _script_excepthook(
    kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    """An uncaught error of the script printed without this bootstrap's frames."""
    tb = script_traceback(tb)
    sys.__excepthook__(kind, exc.with_traceback(tb), tb)  # it prints exc's own traceback


def _stop(bridge: RankMonitorBridge | None) -> None:
    if bridge is not None:
        bridge.close()


def _main(argv: list[str] | None = None, *, direct_child: bool = True) -> None:
    lifeline = hold_launcher(direct_child=direct_child)
    guard = guard_process_group() if lifeline is not None else None
    args = list(sys.argv[1:] if argv is None else argv)
    as_module = bool(args) and args[0] == "-m"
    if as_module:
        args = args[1:]
    if not args:
        raise SystemExit("rankguard worker: no script or module to run")
    target, rest = args[0], args[1:]

    # live recovery: the script sees the training world (a standby, a rank outside it)
    role = rewrite_environ(os.environ)
    env = runenv.current()
    # the heartbeat thread checks the lifeline at every beat (no thread, no check)
    if role is not None and role.standby:  # silent until it takes a rank
        session = install(
            lambda: StandbySession(lambda: session_from_env(runenv.current(), lifeline=lifeline))
        )
    else:
        session = install(lambda: session_from_env(env, lifeline=lifeline))
    dump_file = None
    bridge = None
    if env.monitored and not (role is not None and role.standby):
        assert env.run_dir is not None
        dump_file = install_dump_handler(Path(env.run_dir), env.rank)
        bridge = _serve_nvrx(session, env)
        TraceDumper.start_if_available(Path(env.run_dir), env.rank)
        sampler = CollectiveSampler.start_if_available()
        if sampler is not None:  # the rank's place in its collectives, in each record
            session.add_heartbeat_block(sampler.block)
    freeze_startup()  # torch's and rankguard's module state: no collection walks it again
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _script_excepthook
    try:
        session.install_optimizer_hook()
        if as_module:
            sys.argv = [target, *rest]
            _run_module_as_main(target)
        else:
            sys.argv = [target, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            _run_path_as_main(target)
    except SystemExit as exc:
        code = _exit_code(exc)
        _stop(bridge)
        session.close(
            clean=code == 0,
            exit_code=code,
            error=None if code == 0 else f"SystemExit({exc.code!r})",
        )
        raise
    except BaseException as exc:
        _stop(bridge)
        session.close(clean=False, exit_code=1, error=f"{type(exc).__name__}: {exc}")
        raise
    _stop(bridge)
    session.close(clean=True, exit_code=0)
    del dump_file, guard  # kept until here: faulthandler writes to the file


#: The rank's bootstrap under torch elastic's ``@record``: a script's uncaught error is
#: written to the rank's error file (its own frames: :class:`ScriptErrorHandler`).
main = record(_main, error_handler=ScriptErrorHandler())


def forked_main(*argv: str) -> None:
    """The rank's entry point when the launcher forks ranks from a fork server
    (``--preload``): what ``python -u -m rankguard.launcher.worker ARGV`` does, in a
    process forked from one that has already imported the preloaded modules.

    The rank leads a process group of its own, as one torch elastic starts as a new
    interpreter does: the processes the script starts stay in it, and its guard
    (:func:`guard_process_group`) ends them with the rank. (In the fork server's group,
    the launcher's, they outlived a SIGKILLed launcher.)"""
    if sys.platform.startswith("linux"):
        # on failure the guard sees the rank does not lead its group and stays off
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    _function_main(argv, direct_child=False)


def run_path_main(*argv: str) -> None:
    """torchrun's ``--run-path``: the script run with ``runpy.run_path`` in a process
    torch elastic starts with ``--start-method`` (a child of the launcher), through the
    same bootstrap as any rank (its parent is the launcher, or a fork server with
    ``--start-method forkserver``: the lifeline keeps whichever it is)."""
    _function_main(argv, direct_child=False)


def _function_main(argv: tuple[str, ...], *, direct_child: bool) -> None:
    """A rank started as torch elastic's function entry point (not a new interpreter)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=True)  # lines reach the log now
    try:
        main(list(argv), direct_child=direct_child)
    finally:
        # A forked process leaves with os._exit, which skips atexit: run the script's
        # exit handlers (logging flush, trackers' finish) as a normal exit would.
        atexit._run_exitfuncs()


if __name__ == "__main__":
    main()
