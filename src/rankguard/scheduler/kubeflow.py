"""Kubeflow (``exit_codes: kubeflow``): rankguard's exit codes as Kubeflow's restart
policy reads them, and the taint that keeps an excluded Kubernetes node out.

A Kubeflow ``PyTorchJob`` replica with ``restartPolicy: ExitCode`` treats an exit code
of 1-127 as a permanent failure (the pod is not restarted) and 128-255 as retryable.
rankguard's retryable outcomes (:data:`~rankguard.schema.exits.RETRYABLE`) are
small numbers, so under that policy a hang whose restart budget is spent, a preemption
or a rerun request would end the job for good. With ``exit_codes: kubeflow`` each of
them leaves as ``200 + code`` instead: retryable for Kubeflow, and still readable (the
last two digits are rankguard's code; a launcher stopped by signal N keeps 128+N, at
most 192). The other codes are permanent in both tables:

| rankguard | kubeflow | outcome |
|---|---|---|
| 0 | 0 | training completed |
| 1 | 1 | failed, cause not classified |
| 2 | 2 | bad command line or configuration |
| 3 | 203 | pre-launch GPU check refused this node |
| 10 | 210 | a hang, restart budget spent |
| 11 | 211 | a crash, restart budget spent |
| 12 | 12 | a fault whose action is ``abort`` |
| 13 | 213 | ranks stopped at one step (straggler) |
| 14 | 214 | preempted: the ranks stopped at one step (saved or not) |
| 15 | 215 | bad-node exclusion: this node excluded, or too few nodes left |
| 16 | 216 | rerun: resume to re-run the iteration |
| 17 | 217 | rerun: the first run's GPU was faulty |
| 18 | 18 | stopped: the failure will repeat (its fingerprint) |
| 128+N | 128+N | the launcher was stopped by signal N |
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from rankguard.schema.exits import RETRYABLE
from rankguard.schema.jsontypes import JsonObject

__all__ = ["KUBEFLOW", "KUBEFLOW_OFFSET", "TAINT", "KubeflowScheduler", "kubeflow_exit_code"]

KUBEFLOW_OFFSET = 200
#: the taint that keeps an excluded node out of the job's pods
TAINT = "rankguard.io/excluded=true:NoSchedule"


def kubeflow_exit_code(code: int) -> int:
    """``code`` (rankguard's) as Kubeflow's ``ExitCode`` policy should see it."""
    if code in RETRYABLE:
        return KUBEFLOW_OFFSET + code
    return code


class KubeflowScheduler:
    name = "kubeflow"
    job_id_variables: tuple[str, ...] = ()  # the job's id is torchrun's --rdzv-id
    exit_code_table: str | None = "kubeflow"

    def exit_code(self, code: int) -> int:
        return kubeflow_exit_code(code)

    def requeues(self, code: int) -> bool:
        return 128 <= self.exit_code(code) <= 255

    def exclusion_hint(self, hosts: list[str]) -> JsonObject:
        return {
            "kubectl": [f"kubectl taint nodes {shlex.quote(h)} {shlex.quote(TAINT)}" for h in hosts]
        }

    def hint_lines(self, data: Mapping[str, Any]) -> list[str]:
        return [f"  Kubernetes: {command}" for command in data.get("kubectl") or []]

    def hint_text(self, hint: Mapping[str, Any]) -> str | None:
        commands = hint.get("kubectl") or []
        return f"Kubernetes: {'; '.join(commands)}" if commands else None


KUBEFLOW = KubeflowScheduler()
