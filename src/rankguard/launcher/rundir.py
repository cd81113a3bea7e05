"""The directories ``rankguard run`` writes into: created with ``run_dir_mode`` (0750 by
default), refused when they exist and belong to another user.

A log directory on a shared filesystem can be reached by other users: a run directory
they created (or planted in advance under a predictable run id) would receive this
job's heartbeats, findings and stack dumps and feed their files to this job's monitor.
So the log directory, ``<log_dir>/heartbeat`` and the run directory are this user's or
the launch stops (exit 2). Directories that already exist keep their mode.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ForeignDirectoryError", "owner_name", "prepare_run_dir"]


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


def owner_name(uid: int) -> str:
    """The user name of ``uid``, else the number."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


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
    ``mode``; raise :class:`ForeignDirectoryError` for one that another user owns."""
    log_dir = Path(log_dir).resolve()
    run_dir = Path(run_dir)
    log_dir.parent.mkdir(parents=True, exist_ok=True)  # above log_dir: as any tool does
    _ours(log_dir, mode)
    for part in run_dir.relative_to(log_dir).parts:
        log_dir = log_dir / part
        _ours(log_dir, mode)
