"""``--standalone``: every listening socket of the job is on the loopback interface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import SCRIPTS, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return (
        host.startswith("127.")
        or host == "[00000000000000000000000001000000]"  # ::1
        or (host.startswith("[0000000000000000ffff0000") and host[25:27] == "7f")
    )


def test_standalone_job_listens_on_loopback_only(tmp_path: Path, run_id: str) -> None:
    out_file = tmp_path / "listeners.json"
    res = run_rankguard(
        [*standalone_run(run_id, tmp_path), str(SCRIPTS / "listeners.py"), str(out_file)]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    found = json.loads(out_file.read_text())
    # the launcher's rendezvous store and the round's worker store at least
    assert len(found) >= 2, found
    assert all(_loopback(str(s["local"])) for s in found), found
