"""A straggler's agreed stop (``stop_if_detected``) ends every node's launcher with exit
13: node 0 knows the step from its agreement, every other node from the ``control.json``
its ranks read (it exited 0 there, as if the training had completed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rankguard.config import load_config
from rankguard.launcher.exitcodes import EXIT_OK, EXIT_STRAGGLER, exit_code
from rankguard.launcher.run import _outcome
from rankguard.monitor.agree import write_control

pytestmark = pytest.mark.timeout(30)


class _Completed:
    def is_failed(self) -> bool:
        return False


def _node_k_outcome(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    services = SimpleNamespace(agreement=None, run_dir=run_dir, node_rank=1)
    agent = SimpleNamespace(preemption=None)
    outcome = _outcome(_Completed(), None, agent, services, load_config(None), 0)  # type: ignore[arg-type]
    return exit_code(outcome), capsys.readouterr().err


def test_another_node_exits_13_after_a_stragglers_agreed_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_control(tmp_path, 57, "straggler: rank 3 is slow")
    code, said = _node_k_outcome(tmp_path, capsys)
    assert code == EXIT_STRAGGLER
    assert "every rank stopped at step 57 (stop_if_detected)" in said


def test_without_a_stop_step_another_node_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _node_k_outcome(tmp_path, capsys)
    assert code == EXIT_OK and "stopped" not in said
