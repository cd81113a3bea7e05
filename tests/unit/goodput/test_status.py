"""status.json's ``goodput`` block: the ledger at most every interval while the job
runs, final once the run is over, and ``goodput.json`` beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankguard.goodput import Part
from rankguard.goodput.status import GoodputStatus, largest_loss
from tests.factories import FakeClock
from tests.unit.goodput.synthetic import T0, Rank0, run_dir, train


def _job(d: Path, steps: int) -> Rank0:
    rank = Rank0(d, pid=7, start=T0)
    rank.step(T0 + 4.0)  # 4 s of start-up, then 0.5 s steps
    t = train(rank, T0 + 4.0, steps, 0.5, {})
    rank.end(t + 0.5, clean=True)
    return rank


def test_the_block_is_the_ledger_at_most_every_interval_and_final_at_the_end(
    tmp_path: Path,
) -> None:
    d = run_dir(tmp_path)
    first = _job(d, 9)
    first.write()
    clock, over = FakeClock(), [False]
    source = GoodputStatus(d, interval_s=30.0, ended=lambda: over[0], clock=clock)
    block = source.status_fields()["goodput"].to_dict()  # its form in status.json
    assert block["final"] is False
    assert block["productive_s"] == pytest.approx(4.5, abs=0.01)
    assert block["wall_s"] == pytest.approx(9.0, abs=0.01)
    assert block["ettr"] == pytest.approx(4.5 / 9.0, abs=1e-3)
    assert block["largest_loss"] == {"part": "startup", "seconds": pytest.approx(4.0, abs=0.01)}
    assert block["parts_s"]["startup"] == pytest.approx(4.0, abs=0.01)
    assert sum(block["parts_s"].values()) == pytest.approx(block["wall_s"], abs=0.01)
    on_disk = json.loads((d / "goodput.json").read_text())
    assert on_disk["ettr"] == block["ettr"] and on_disk["final"] is False
    # ten more steps: not read before the interval is over
    (d / "rank_0_pid_7.heartbeat.jsonl").unlink()
    _job(d, 19).write()
    clock.t += 10
    assert source.status_fields()["goodput"].to_dict() == block
    clock.t += 25
    later = source.status_fields()["goodput"]
    assert later.productive_s == pytest.approx(9.5, abs=0.01)
    # the run is over: read at once, marked final, and never again
    over[0] = True
    final = source.status_fields()["goodput"]
    assert final.final is True
    assert json.loads((d / "goodput.json").read_text())["final"] is True
    (d / "rank_0_pid_7.heartbeat.jsonl").unlink()
    clock.t += 100
    assert source.status_fields()["goodput"] == final


def test_no_heartbeat_of_rank_0_is_no_block(tmp_path: Path) -> None:
    source = GoodputStatus(run_dir(tmp_path))
    assert source.status_fields() == {}
    assert not (tmp_path / "goodput.json").exists()


def test_the_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        GoodputStatus(tmp_path, interval_s=0)


def test_the_largest_loss_is_never_productive_time() -> None:
    parts = dict.fromkeys(Part, 0.0)
    assert largest_loss(parts) is None
    parts[Part.PRODUCTIVE] = 100.0
    parts[Part.RECOVERY] = 3.0
    parts[Part.DETECTION_WAIT] = 2.0
    assert largest_loss(parts) == (Part.RECOVERY, 3.0)
