"""``--preload``'s fork server, started before the launcher imports torch.

Its own import of the preloaded modules (torch: 2-5 s of CPU) then runs while the
launcher imports torch for torchrun's parser and sets the launch up, instead of after.
Nothing here imports torch. The server is Python's one fork server
(:mod:`multiprocessing.forkserver`): torch elastic forks the ranks from it later,
:func:`rankguard.launcher.run.start_fork_server` finds it running.

The server's environment is the launcher's at this point, plus what must be there
before it imports torch: ``OMP_NUM_THREADS`` (read when the OpenMP runtime loads), the
configuration's ``envs`` (as FlagScale exports them before its launch) and the
launcher's pid (the server dies with the launcher:
:mod:`rankguard.launcher.forkserver_guard`). The launcher's own environment is left as
it was. What the launcher sets for its workers afterwards (the run's identity, the
features' settings) reaches each forked rank with its arguments
(:func:`env_argument`), applied by :func:`rankguard.launcher.worker.forked_main` before
anything else runs in it.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from collections.abc import Mapping

from rankguard.rank.identity import ENV

__all__ = [
    "ENV_ARG_PREFIX",
    "apply_env_argument",
    "env_argument",
    "fork_server_tempdir",
    "preload_modules",
    "preload_requested",
    "server_preload",
    "start_early",
    "take_run_id",
]

#: the first argument of a forked rank that carries the launcher's environment changes
ENV_ARG_PREFIX = "rankguard-env:"

#: what torch elastic gives each worker itself at its start: its value wins, as it does
#: over the launcher's environment for a rank started as a new interpreter
TORCH_WORKER_KEYS = frozenset(
    {
        "LOCAL_RANK",
        "RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "OMP_NUM_THREADS",
    }
)

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


def server_preload(modules: tuple[str, ...]) -> list[str]:
    """Everything the fork server imports: "__main__" first, as Python's own default
    (the forked ranks then do not re-run the launcher's main module); then the guard
    that ties the server to the launcher (it dies with it, and so do the ranks), before
    the long imports; the ranks' bootstrap; the modules."""
    return [
        "__main__",
        "rankguard.launcher.forkserver_guard",
        "rankguard.launcher.worker",
        *preload_modules(modules),
    ]


#: a Unix socket's longest path (``sun_path`` less its terminating NUL)
_UNIX_PATH_MAX = 107
#: what Python's fork server adds to the temp directory for its socket
_FORK_SERVER_SOCKET = "/pymp-xxxxxxxx/listener-xxxxxxxx"


def fork_server_tempdir() -> str | None:
    """A shorter directory for the fork server's socket when the temp directory
    (``TMPDIR``) is too long for a Unix socket's path (a batch scheduler's per-job
    directory can be); None when it will do. ValueError when no shorter one is usable."""
    import tempfile

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


# The fork server's environment as it was started early (None: not started here).
_server_env: dict[str, str] | None = None


def _flag_values(argv: list[str]) -> dict[str, str]:
    """The value of each option in a ``rankguard run`` line, read up to the training
    script as :func:`rankguard.launcher.argv.pre_pass` reads it (the last one wins)."""
    from rankguard.launcher.argv import OWN_SWITCHES, TORCH_SWITCHES, is_override

    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("-") and len(word) > 1 and word != "--":
            name, eq, given = word.partition("=")
            # as torchrun's parser reads it: ``-r3`` carries its value
            if (
                not eq
                and name not in TORCH_SWITCHES | OWN_SWITCHES
                and (name.startswith("--") or len(name) <= 2)
            ):
                given = argv[i + 1] if i + 1 < len(argv) else ""
                i += 1
            values[name.replace("_", "-")] = given
        elif not is_override(word):
            break  # the script: its own words follow
        i += 1
    return values


def preload_requested(argv: list[str]) -> tuple[str, ...]:
    """The modules of ``--preload`` (or ``PET_PRELOAD``) in a ``rankguard run`` line."""
    value = _flag_values(argv).get("--preload", os.environ.get("PET_PRELOAD", ""))
    return tuple(m.strip() for m in value.split(",") if m.strip())


# A single node's run id made here, for the launch to take (:func:`take_run_id`).
_local_run_id: str | None = None


def _run_id(argv: list[str]) -> str | None:
    """The run id the launch will have (``LaunchOptions.run_id``), when the line tells
    it: the one given, torchrun's ``none`` for several nodes, or one made now for a
    single node (the launch takes it); None when the node count cannot be read."""
    global _local_run_id
    values = _flag_values(argv)
    given = values.get("--run-id") or values.get("--rdzv-id") or os.environ.get("PET_RDZV_ID")
    if given and given != "none":
        return given
    nnodes = values.get("--nnodes", os.environ.get("PET_NNODES", "1"))
    try:
        most = int(nnodes.split(":")[-1])
    except ValueError:
        return None
    if most > 1 and "--standalone" not in values:
        return "none"
    _local_run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    return _local_run_id


def take_run_id() -> str | None:
    """The single node's run id made when the fork server started early (once)."""
    global _local_run_id
    made, _local_run_id = _local_run_id, None
    return made


def start_early(
    argv: list[str],
    modules: tuple[str, ...],
    envs: Mapping[str, str],
    nproc_per_node: str | None,
) -> bool:
    """Start the fork server that imports ``modules`` now; True when it did. Not when
    the count of ranks is not a number (``auto``, ``gpu``: torch decides it, and with it
    ``OMP_NUM_THREADS``), nor when a module cannot be found or the server cannot start:
    the launch then starts it where it always did, and says what is wrong there."""
    global _server_env
    import importlib.util
    import multiprocessing
    import multiprocessing.forkserver
    import tempfile

    try:
        count = int((nproc_per_node or "1").strip())
    except ValueError:
        return False
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    try:
        short = fork_server_tempdir()
    except ValueError:
        return False
    multiprocessing.set_forkserver_preload(server_preload(modules))
    saved_env = dict(os.environ)
    saved_tmp = tempfile.tempdir
    try:
        os.environ.update(envs)
        os.environ[ENV.LAUNCHER_PID] = str(os.getpid())
        run_id = _run_id(argv)
        if run_id is not None:  # the ranks' /proc/PID/environ names their run, as before
            os.environ[ENV.RUN_ID] = run_id
        if count > 1 and "OMP_NUM_THREADS" not in os.environ:
            os.environ["OMP_NUM_THREADS"] = "1"  # as the launch sets it for the ranks
        if short is not None:
            tempfile.tempdir = short  # where Python's fork server makes its socket's directory
        server_env = dict(os.environ)
        multiprocessing.forkserver.ensure_running()
    except OSError:
        return False
    finally:
        tempfile.tempdir = saved_tmp
        os.environ.clear()
        os.environ.update(saved_env)
    _server_env = server_env
    return True


def env_argument(environ: Mapping[str, str] | None = None) -> list[str]:
    """The first argument of a forked rank: the launcher's environment less the fork
    server's (a removed variable as null), torch elastic's per-worker variables left to
    it; empty when the server was not started early (it has the launcher's environment
    then)."""
    if _server_env is None:
        return []
    env = os.environ if environ is None else environ
    changes: dict[str, str | None] = {
        k: v for k, v in env.items() if _server_env.get(k) != v and k not in TORCH_WORKER_KEYS
    }
    changes.update({k: None for k in _server_env if k not in env and k not in TORCH_WORKER_KEYS})
    # base64: torch elastic substitutes ``${local_rank}`` in string arguments
    text = base64.b64encode(json.dumps(changes, sort_keys=True).encode()).decode("ascii")
    return [ENV_ARG_PREFIX + text]


def apply_env_argument(argv: tuple[str, ...]) -> tuple[str, ...]:
    """In a forked rank: apply the launcher's environment changes its first argument
    carries (:func:`env_argument`), if it does; the rest of the arguments."""
    if not argv or not argv[0].startswith(ENV_ARG_PREFIX):
        return argv
    changes = json.loads(base64.b64decode(argv[0][len(ENV_ARG_PREFIX) :]))
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return argv[1:]
