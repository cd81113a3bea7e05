"""End to end: ``--preload`` of a module whose import outlasts the initial timeout. The
ranks are forked only once the fork server has imported it; the initial timeout counts
from that fork, not from the monitor's start, so the ranks are not reported as never
seen, and the launcher says in one line that the fork server is still importing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import no_leftover_workers, read_jsonl, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

IMPORT_S = 9  # the preloaded module's import: past the initial timeout below
INITIAL_S = 4


def test_a_slow_preload_is_said_as_such_not_as_ranks_never_seen(
    tmp_path: Path, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_preload_mod.py").write_text(f"import time\ntime.sleep({IMPORT_S})\n")
    script = tmp_path / "short.py"
    script.write_text("import time\ntime.sleep(1.5)\n")
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), path) if p))
    logs = tmp_path / "logs"
    res = run_rankguard(
        [
            *standalone_run(run_id, logs, nproc=1),
            "--set",
            f"heartbeat.initial_process_timeout_s={INITIAL_S}",
            "--preload",
            "slow_preload_mod",
            str(script),
        ],
        timeout=150,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    findings = read_jsonl(logs / "heartbeat" / run_id / "findings.jsonl")
    assert findings == [], out
    said = [line for line in out.splitlines() if "the fork server has imported for" in line]
    assert len(said) == 1, out
    assert "--preload slow_preload_mod" in said[0], said
    assert no_leftover_workers(run_id)
