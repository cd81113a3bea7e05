"""The :class:`Scheduler` interface: what rankguard needs to know of the system that
runs and retries a job (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from rankguard.schema.jsontypes import JsonObject

__all__ = ["Scheduler"]


class Scheduler(Protocol):
    """One scheduler (plain, Slurm, Kubeflow): its name, the environment variable that
    names its job, its exit-code table, how it leaves out an excluded host, and which
    exit codes it runs again."""

    name: str
    #: the environment variables that name the job (read by :mod:`rankguard.rank.runenv`)
    job_id_variables: tuple[str, ...]
    #: its value of the ``exit_codes`` setting (None: it reads rankguard's own table)
    exit_code_table: str | None

    def exit_code(self, code: int) -> int:
        """rankguard's exit ``code`` as this scheduler should see it."""
        ...

    def requeues(self, code: int) -> bool:
        """Whether the scheduler runs the job again after exit ``code`` (as its
        retry policy reads :meth:`exit_code`)."""
        ...

    def exclusion_hint(self, hosts: list[str]) -> JsonObject:
        """The fields ``excluded_nodes.json`` and the ``node_excluded`` finding carry for
        this scheduler: the command or option that leaves ``hosts`` out (each host one
        shell word, quoted)."""
        ...

    def hint_lines(self, data: Mapping[str, Any]) -> list[str]:
        """What ``rankguard status`` says of this scheduler's fields in ``data``."""
        ...

    def hint_text(self, hint: Mapping[str, Any]) -> str | None:
        """Its part of the launcher's line naming the excluded hosts, or None."""
        ...
