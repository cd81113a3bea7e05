"""What tools read from the start of a run: ``findings.jsonl`` is there, empty, before
any finding (a tool tails it from the start), and stays empty through a healthy run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import ThreadedJob

pytestmark = pytest.mark.timeout(60)


def test_the_findings_file_is_there_and_empty_from_the_start_of_a_run(tmp_path: Path) -> None:
    job = ThreadedJob(tmp_path, 2, stepped=True)
    seen: dict[str, bytes] = {}

    def drive(job: ThreadedJob) -> None:  # the ranks are running, nothing scanned yet
        seen["at_start"] = (job.run_dir / "findings.jsonl").read_bytes()

    res = job.run(lambda ctx: ctx.train(5), drive=drive)
    assert seen["at_start"] == b""
    assert res.values() == [5, 5]
    assert (res.run_dir / "findings.jsonl").read_bytes() == b""
    assert res.status is not None and res.status["state"] == "completed"
