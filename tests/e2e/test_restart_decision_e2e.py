"""Restart or stop, end to end: a rank SIGKILLed at start-up (the same way twice) is
still restarted; then a script that fails at start-up with an ``ImportError`` stops
after one attempt (exit 18, one line naming its fingerprint) although restarts were
left. Every rule of the decision: ``tests/unit/ft/test_restart_decision.py``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, read_jsonl, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    import torch
    import torch.distributed as dist

    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart == 2:
        import not_a_module_rankguard_e2e  # noqa: F401
    dist.init_process_group("gloo")
    if restart < 2 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # before the first step, twice
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.05)
    dist.destroy_process_group()
    """
).lstrip()
IMPORT_LINE = SCRIPT.splitlines().index("    import not_a_module_rankguard_e2e  # noqa: F401") + 1


def test_killed_at_startup_restarts_then_an_import_error_stops_after_one_attempt(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: the agent's exit reports (a signal, a traceback in torch
    elastic's error file) decide restart or stop, and the launcher's exit code."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    log_dir = tmp_path / "logs"
    res = run_rankguard([*standalone_run(run_id, log_dir), "--max-restarts", "5", str(script)])
    out = res.stdout + res.stderr
    assert res.returncode == 18, out
    stops = [ln for ln in out.splitlines() if "stop, no restart" in ln]
    assert len(stops) == 1, out
    assert "ModuleNotFoundError before the first step" in stops[0]
    assert "No module named 'not_a_module_rankguard_e2e'" in stops[0]
    assert f"train.py:{IMPORT_LINE}:<module>" in stops[0]
    *restarts, stop = read_jsonl(log_dir / "heartbeat" / run_id / "restarts.jsonl")
    assert [(r["kind"], r["decision"], r["rule"]) for r in restarts] == [
        ("process", "restart", "transient"),
        ("process", "restart", "transient"),
    ]
    assert all(r["fingerprint"]["signal"] == "SIGKILL" for r in restarts)
    assert (stop["kind"], stop["decision"], stop["rule"]) == (
        "stop",
        "stop",
        "deterministic_at_startup",
    )
    assert stop["fingerprint"]["key"] in stops[0]
    assert "2 in-job restart(s) spent (budget 5)" in out  # none spent on the stop
    assert no_leftover_workers(run_id)
