"""The directories ``rankguard run`` writes into: created with ``run_dir_mode`` (0750 by
default), refused when they exist and belong to another user.

A log directory on a shared filesystem can be reached by other users: a run directory
they created (or planted in advance under a predictable run id) would receive this
job's heartbeats, findings and stack dumps and feed their files to this job's monitor.
So the log directory, ``<log_dir>/heartbeat`` and the run directory are this user's or
the launch stops (exit 2). Directories that already exist keep their mode.

The run id names the run directory, so it must be one plain name (:func:`check_run_id`):
``--rdzv-id ../../x`` or one with a newline would put the run outside ``log_dir`` or
forge lines in the logs that print it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rankguard._fs import owner_name

__all__ = ["ForeignDirectoryError", "check_run_id", "owner_name", "prepare_run_dir"]

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


def prepare_run_dir(log_dir: Path, run_dir: Path, mode: int) -> None:
    """Create ``log_dir`` and every directory down to ``run_dir`` (inside it) with
    ``mode``; raise :class:`ForeignDirectoryError` for one that another user owns, and
    ValueError for a part of ``run_dir`` that is not a plain name (:func:`check_run_id`)."""
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
