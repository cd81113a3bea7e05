"""Checks of the command line against the configuration, before anything starts.

The configuration's own warnings are :meth:`RankguardConfig.warnings`; what needs the
launch options too (the restart budget, the node's place in the job) is here. Pure: the
launcher prints the warnings and turns a ``ValueError`` into a usage error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankguard.config import RankguardConfig
from rankguard.launcher.options import LaunchOptions

__all__ = ["LaunchChecks", "check_launch"]


@dataclass(frozen=True, slots=True)
class LaunchChecks:
    max_restarts: int  # the in-job restart budget in force
    warnings: tuple[str, ...] = ()


def check_launch(opts: LaunchOptions, cfg: RankguardConfig) -> LaunchChecks:
    """The restart budget in force and the warnings for ``opts`` with ``cfg``.

    ``--max-restarts`` (torchrun's flag) and ``fault_tolerance.num_in_job_restarts``
    (NVRx's key) set one budget: a ValueError when both are given and disagree.
    """
    hb, ft = cfg.heartbeat, cfg.fault_tolerance
    max_restarts = opts.max_restarts
    if ft.num_in_job_restarts:
        if opts.max_restarts and opts.max_restarts != ft.num_in_job_restarts:
            raise ValueError(
                f"--max-restarts {opts.max_restarts} and fault_tolerance.num_in_job_restarts="
                f"{ft.num_in_job_restarts} disagree: give one of them"
            )
        max_restarts = ft.num_in_job_restarts
    warnings = []
    if max_restarts and not ft.enable_ft_package and hb.enabled:
        warnings.append(
            f"{max_restarts} in-job restart(s) for crashes only: hangs found by the monitor "
            "are reported, not restarted (set fault_tolerance.enable_ft_package=true)"
        )
    if opts.multi_node and hb.enabled and not cfg.no_shared_fs and opts.node_rank != 0:
        # node rank unknown (told by the rendezvous later): said for every node
        which = "this node's heartbeats are" if opts.node_rank else "heartbeats of nodes > 0 are"
        warnings.append(
            f"no_shared_fs=false: {which} NOT relayed; node 0 sees them "
            "only if log_dir is on a filesystem shared with it"
        )
    warnings.extend(_exclusion_warnings(opts, ft, max_restarts, cfg.node_health.enabled))
    _check_standbys(opts, cfg)
    return LaunchChecks(max_restarts, tuple(warnings))


def _check_standbys(opts: LaunchOptions, cfg: RankguardConfig) -> None:
    """``--standby-ranks`` where standbys cannot work: one line, before the launch."""
    from rankguard.launcher.options import ENTRY_PYTHON

    ip = cfg.inprocess_restart
    if not ip.standby_ranks:
        return
    flag = f"--standby-ranks {ip.standby_ranks}"
    if not ip.enabled:
        raise ValueError(
            f"{flag}: a standby waits inside the in-process wrapper: set "
            "inprocess_restart.enabled=true and wrap the training function "
            "(rankguard.inprocess.wrap)"
        )
    if opts.entry != ENTRY_PYTHON:
        raise ValueError(f"{flag}: not with --{opts.entry} (the ranks run rankguard's bootstrap)")
    if opts.preload:
        from rankguard.launcher.live_forked import forked_unsupported

        why = forked_unsupported()
        if why is not None:
            raise ValueError(
                f"{flag}: not with --preload on this torch ({why}: its forked ranks cannot "
                "be watched one by one); leave out --preload"
            )


def _exclusion_warnings(
    opts: LaunchOptions, ft: Any, max_restarts: int, node_health: bool
) -> list[str]:
    """Bad-node exclusion configured where it cannot do all it says."""
    if not ft.exclusion:
        return []
    out = []
    if opts.min_nodes == opts.max_nodes:
        out.append(
            f"bad-node exclusion with --nnodes {opts.max_nodes} (MIN = MAX): an excluded "
            "node ends the job (exit 15, the host list for the scheduler); give --nnodes "
            "MIN:MAX for the others to go on without it"
        )
    if ft.exclude_after_restarts > max_restarts:
        out.append(
            f"fault_tolerance.exclude_after_restarts={ft.exclude_after_restarts} is more "
            f"than the in-job restart budget ({max_restarts}): the job ends before a node "
            "is excluded for its restarts"
        )
    if ft.exclude_bad_nodes and not max_restarts:
        checks = "the GPU and node health checks run" if node_health else ("the GPU check runs")
        out.append(
            f"fault_tolerance.exclude_bad_nodes with no in-job restart: {checks} "
            "before the first round only, and an exit 17 ends the job as before"
        )
    if opts.rdzv_backend == "static" and opts.max_nodes > 1:
        out.append(
            "bad-node exclusion with --rdzv-backend static: the group is fixed, the other "
            "nodes wait for an excluded one until their timeouts; use --rdzv-backend c10d"
        )
    elif opts.rdzv_backend not in ("c10d", "static"):
        out.append(
            f"bad-node exclusion with --rdzv-backend {opts.rdzv_backend}: an excluded node "
            "leaves through its keep-alive (the others wait for it to expire)"
        )
    return out
