"""Slurm integration: job-level retries around ``rankguard run``.

Two layers of fault tolerance stack: ``rankguard run --max-restarts`` restarts the ranks
inside the job; once that budget is spent it exits with a code from
:mod:`rankguard.launcher.exitcodes`, and this package decides whether the whole job runs
again (:func:`decide`): by ``scontrol requeue`` from the script :func:`render_sbatch`
writes, or by :func:`run_with_retries` where nothing can requeue. See ``docs/slurm.md``.
"""

from __future__ import annotations

from rankguard.slurm.cli import add_parser, run
from rankguard.slurm.retry import Decision, decide, run_with_retries
from rankguard.slurm.sbatch import SbatchSpec, parse_job_id, render_sbatch

__all__ = [
    "Decision",
    "SbatchSpec",
    "add_parser",
    "decide",
    "parse_job_id",
    "render_sbatch",
    "run",
    "run_with_retries",
]
