"""FlagScale's path of rank 0's perf summary.

FlagScale writes ``<exp_dir>/logs/perf_monitor/perf_summary_<ts>.json``; rankguard keeps
each run's perf files in their own folder, ``<log_dir>/perf_monitor/<run_id>/``. With a
FlagScale experiment file (``perf.flagscale_summary_link``, set by its ``exp_dir``) the
summary is also shown at FlagScale's path, as a link, so a user's script that looks
there finds it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rankguard.schema.layout import PERF_SUMMARY_PREFIX

__all__ = ["link_flagscale_summary"]

logger = logging.getLogger(__name__)


def link_flagscale_summary(summary: Path) -> Path | None:
    """FlagScale's path of a run's perf summary, ``<log_dir>/perf_monitor/<name>``: a
    relative link to ``<run_id>/<name>`` (rewritten atomically there, so the link always
    shows the latest), replaced atomically; links left by pruned runs are removed. An
    existing file that is not a link is left alone. None (one warning) when it cannot
    be made."""
    parent, name = summary.parent.parent, summary.name
    link = parent / name
    target = os.path.join(summary.parent.name, name)
    try:
        for old in parent.glob(f"{PERF_SUMMARY_PREFIX}*.json"):
            if old.is_symlink() and not old.exists():
                old.unlink()
        if link.is_symlink() and os.readlink(link) == target:
            return link
        if link.exists() and not link.is_symlink():
            logger.warning("rankguard perf: %s exists and is not rankguard's link: kept", link)
            return None
        tmp = parent / f".{name}.{os.getpid()}.link"
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except OSError as exc:
        logger.warning("rankguard perf: cannot link %s to %s: %s", link, summary, exc)
        return None
    return link
