"""No scheduler (or one that only reads rankguard's own exit codes): the job is not run
again by anyone but the user."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankguard.schema.jsontypes import JsonObject

__all__ = ["PLAIN", "PlainScheduler"]


class PlainScheduler:
    name = "plain"
    job_id_variables: tuple[str, ...] = ()
    exit_code_table: str | None = "rankguard"

    def exit_code(self, code: int) -> int:
        return code

    def requeues(self, code: int) -> bool:
        return False

    def exclusion_hint(self, hosts: list[str]) -> JsonObject:
        return {}

    def hint_lines(self, data: Mapping[str, Any]) -> list[str]:
        return []

    def hint_text(self, hint: Mapping[str, Any]) -> str | None:
        return None


PLAIN = PlainScheduler()
