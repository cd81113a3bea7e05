"""The schedulers behind one interface: the registry, what the rest of rankguard asks
of it, and no scheduler's name tested outside ``rankguard.scheduler``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from rankguard.rank.runenv import RunEnv
from rankguard.scheduler import (
    EXIT_CODE_TABLES,
    JOB_ID_VARIABLES,
    SCHEDULERS,
    Scheduler,
    exclusion_hint_lines,
    exclusion_hint_text,
    exclusion_hints,
    for_exit_codes,
)
from rankguard.view.runfiles import excluded_lines

SRC = Path(__file__).resolve().parents[3] / "src" / "rankguard"

#: the modules that once tested a scheduler by name
WIRING = (
    "launcher/run.py",
    "launcher/exclusion.py",
    "view/runfiles.py",
    "config.py",
    "rank/runenv.py",
)
NAMES = ("slurm", "kubeflow", "kubectl", "kubernetes")


def _tested_names(path: Path) -> list[str]:
    """String constants a module compares with, indexes by or asks ``.get`` for (the
    ways code tests a name), naming a scheduler."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        texts: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            texts = [node.left, *node.comparators]
        elif isinstance(node, ast.Subscript):
            texts = [node.slice]
        elif isinstance(node, ast.Dict):
            texts = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get":
            texts = list(node.args[:1])
        elif isinstance(node, ast.Attribute) and "SLURM" in node.attr.upper():
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and any(n in str(node.module) for n in NAMES):
            found.append(str(node.module))  # one scheduler's module, not the registry
        for text in texts:
            for leaf in ast.walk(text):
                text_value = leaf.value if isinstance(leaf, ast.Constant) else None
                if isinstance(text_value, str) and any(n in text_value.lower() for n in NAMES):
                    found.append(text_value)
    return found


def test_no_scheduler_name_is_tested_outside_the_schedulers() -> None:
    for rel in WIRING:
        assert _tested_names(SRC / rel) == [], rel


def test_the_registry() -> None:
    assert [s.name for s in SCHEDULERS] == ["plain", "slurm", "kubeflow"]
    assert all(isinstance(s.name, str) for s in SCHEDULERS)
    assert EXIT_CODE_TABLES == ("rankguard", "kubeflow")
    assert for_exit_codes("rankguard").name == "plain"
    assert for_exit_codes("kubeflow").exit_code(14) == 214
    assert "SLURM_JOB_ID" in JOB_ID_VARIABLES
    for scheduler in SCHEDULERS:
        _: Scheduler = scheduler  # each one satisfies the interface (mypy)


def test_the_job_id_comes_from_a_schedulers_variable() -> None:
    assert RunEnv.from_environ({"SLURM_JOB_ID": "77"}).job_id == "77"
    assert RunEnv.from_environ({}).job_id is None


def test_the_exclusion_hints_and_their_lines(tmp_path: Path) -> None:
    hints = exclusion_hints(["b", "a;rm -rf /", "b"])
    assert hints == {
        "slurm_exclude": "'--exclude=a;rm -rf /,b'",
        "kubectl": [
            "kubectl taint nodes 'a;rm -rf /' rankguard.io/excluded=true:NoSchedule",
            "kubectl taint nodes b rankguard.io/excluded=true:NoSchedule",
        ],
    }
    assert exclusion_hint_lines(hints) == [
        "  Slurm: '--exclude=a;rm -rf /,b'",
        "  Kubernetes: kubectl taint nodes 'a;rm -rf /' rankguard.io/excluded=true:NoSchedule",
        "  Kubernetes: kubectl taint nodes b rankguard.io/excluded=true:NoSchedule",
    ]
    assert exclusion_hint_text(exclusion_hints(["h"])) == (
        "Slurm: sbatch --exclude=h; "
        "Kubernetes: kubectl taint nodes h rankguard.io/excluded=true:NoSchedule"
    )
    assert exclusion_hints([]) == {"slurm_exclude": None, "kubectl": []}
    (tmp_path / "excluded_nodes.json").write_text(json.dumps({"hosts": ["h"], **hints}))
    assert excluded_lines(tmp_path)[1:] == exclusion_hint_lines(hints)
