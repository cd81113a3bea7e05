"""Slurm: ``$SLURM_JOB_ID`` names the job; ``rankguard slurm``'s sbatch script requeues
the job on a retryable exit code (:data:`~rankguard.schema.exits.RETRYABLE`), with
``--exclude`` for the hosts bad-node exclusion left out."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from rankguard.schema.exits import RETRYABLE
from rankguard.schema.jsontypes import JsonObject

__all__ = ["SLURM", "SlurmScheduler"]


class SlurmScheduler:
    name = "slurm"
    job_id_variables: tuple[str, ...] = ("SLURM_JOB_ID",)
    exit_code_table: str | None = None  # the sbatch script reads rankguard's codes

    def exit_code(self, code: int) -> int:
        return code

    def requeues(self, code: int) -> bool:
        return code in RETRYABLE

    def exclusion_hint(self, hosts: list[str]) -> JsonObject:
        return {"slurm_exclude": shlex.quote(f"--exclude={','.join(hosts)}") if hosts else None}

    def hint_lines(self, data: Mapping[str, Any]) -> list[str]:
        return [f"  Slurm: {data['slurm_exclude']}"] if data.get("slurm_exclude") else []

    def hint_text(self, hint: Mapping[str, Any]) -> str | None:
        option = hint.get("slurm_exclude")
        return f"Slurm: sbatch {option}" if option else None


SLURM = SlurmScheduler()
