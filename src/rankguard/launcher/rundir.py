"""The directories ``rankguard run`` writes into: created with ``run_dir_mode`` (0750 by
default), refused when they exist and belong to another user.

A log directory on a shared filesystem can be reached by other users: a run directory
they created (or planted in advance under a predictable run id) would receive this
job's heartbeats, findings and stack dumps and feed their files to this job's monitor.
So the log directory, ``<log_dir>/heartbeat`` and the run directory are this user's or
the launch stops (exit 2). Directories that already exist keep their mode; a
``control.json`` an earlier launcher of the same run id left (the stop step it agreed
on) is removed by the launcher that hosts the rendezvous store: the ranks count their
steps anew. A launcher joining a running job leaves it (it may be the live stop step).

The run id names the run directory, so it must be one plain name (:func:`check_run_id`):
``--rdzv-id ../../x`` or one with a newline would put the run outside ``log_dir`` or
forge lines in the logs that print it.

torchrun's default run id (``none``, what a Kubernetes PyTorchJob runs with: no
``--rdzv-id``) is the same for every launch: the run directory of a job that keeps it is
``none-<date>-<time>-<hex>`` (:func:`launch_name`), one per launch, so a rerun into the
same log directory never mixes its files with an earlier run's; ``<log_dir>/heartbeat/latest``
points at the newest (:func:`link_latest`). The nodes agree on the name through the
rendezvous store when the launcher holds one (c10d); without it each node names its own
(its files are its own with ``no_shared_fs``, the default).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from rankguard.schema.layout import CONTROL_FILE
from rankguard.util.fs import owner_name

__all__ = [
    "DEFAULT_RUN_ID",
    "LATEST_LINK",
    "ForeignDirectoryError",
    "agreed_name",
    "check_creatable",
    "check_run_id",
    "launch_name",
    "link_latest",
    "owner_name",
    "prepare_run_dir",
]

DEFAULT_RUN_ID = "none"  # torchrun's --rdzv-id when none is given
LATEST_LINK = "latest"  # <log_dir>/heartbeat/latest -> the newest default-id run directory

_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,199}")


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is one plain name (letters, digits, ``_.:@+=-``, at most 200,
    not starting with a dot or a dash); ValueError naming the run id otherwise."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise ValueError(
            f"--rdzv-id (run id) {run_id!r:.80}: must be one name of letters, digits and "
            "'_.:@+=-' (at most 200, starting with a letter or digit)"
        )
    return run_id


def check_creatable(path: str | os.PathLike[str], what: str) -> None:
    """``path`` is a directory this user can write, or one it can create: ValueError
    naming ``what`` and the path otherwise. Torch-free, run before anything is started.

    The first missing directory on the way is created and removed again: only a real
    ``mkdir`` tells (``/proc/x``: ``/proc`` is a directory that ``access()`` calls
    writable for root, yet nothing can be created in it)."""
    path = Path(path).absolute()
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{what} {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "is not writable" if probe == path else f"cannot be created ({probe} is not writable)"
        raise ValueError(f"{what} {path}: {why}")
    if probe == path:
        return
    first = path
    while first.parent != probe:
        first = first.parent
    try:
        os.mkdir(first, 0o700)
    except FileExistsError:
        return  # created meanwhile (another launch): it is there
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot be created ({exc.strerror})") from None
    with contextlib.suppress(OSError):  # something was created in it meanwhile: it stays
        os.rmdir(first)


def launch_name(run_id: str) -> str:
    """A run directory name of its own for this launch: ``<run_id>-<date>-<time>-<hex>``."""
    return f"{run_id}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def agreed_name(store: Any, key: str, proposal: str) -> str:
    """The run directory name every node of the job uses: the first node's proposal
    (``compare_set`` on the rendezvous store: the first to ask wins). What the store
    gives back is checked as a run id (anyone reaching the store could have written it)."""
    value = store.compare_set(key, "", proposal)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return check_run_id(text[:200])


def link_latest(parent: Path, name: str) -> bool:
    """``parent/latest`` -> ``name``, replaced atomically; False (nothing changed) where
    ``latest`` is a real directory (a run whose id is ``latest``) or cannot be written."""
    link = parent / LATEST_LINK
    if link.exists() and not link.is_symlink():
        return False
    tmp = parent / f".{LATEST_LINK}.{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(name, tmp)
        os.replace(tmp, link)
    except OSError:
        return False
    return True


class ForeignDirectoryError(RuntimeError):
    """A directory the launcher writes into belongs to another user."""

    def __init__(self, path: Path, uid: int) -> None:
        super().__init__(
            f"{path} belongs to {owner_name(uid)} (uid {uid}), not to this user "
            f"({owner_name(os.getuid())}, uid {os.getuid()}): refusing to write there; "
            "choose another --log-dir (or log_dir)"
        )
        self.path = path
        self.uid = uid


def _ours(path: Path, mode: int) -> None:
    """Create ``path`` (one level) with ``mode``, or check that the existing one is ours."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        st = os.stat(path)  # follows a symlink: the directory actually written into
        if st.st_uid != os.getuid():
            raise ForeignDirectoryError(path, st.st_uid) from None
        if not path.is_dir():
            raise NotADirectoryError(f"{path} exists and is not a directory") from None
        return
    os.chmod(path, mode)  # the umask may have taken bits away


def prepare_run_dir(log_dir: Path, run_dir: Path, mode: int, *, first: bool = True) -> None:
    """Create ``log_dir`` and every directory down to ``run_dir`` (inside it) with
    ``mode``; raise :class:`ForeignDirectoryError` for one that another user owns, and
    ValueError for a part of ``run_dir`` that is not a plain name (:func:`check_run_id`).

    ``first``: this launcher starts the run (it hosts the rendezvous store), so a
    ``control.json`` in the run directory is an earlier launch's and is removed. A
    launcher that joins a running job (another node, a hot spare starting late on a
    shared log directory) passes False: the stop step it finds may be the live one."""
    log_dir = Path(log_dir).resolve()
    run_dir = Path(run_dir)
    if not run_dir.is_absolute():
        run_dir = Path.cwd() / run_dir
    for part in run_dir.relative_to(log_dir).parts:
        check_run_id(part)
    log_dir.parent.mkdir(parents=True, exist_ok=True)  # above log_dir: as any tool does
    _ours(log_dir, mode)
    for part in run_dir.relative_to(log_dir).parts:
        log_dir = log_dir / part
        _ours(log_dir, mode)
    # A stop step an earlier launcher of this run id agreed on (a requeued Slurm job
    # keeps its job id, the run id): this launcher's ranks count their steps from their
    # own start and would stop that many steps into the resumed run, as if preempted.
    if first:
        (run_dir / CONTROL_FILE).unlink(missing_ok=True)
