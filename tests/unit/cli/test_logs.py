"""``rankguard logs``: one global rank's files from the launcher's index."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

from rankguard.cli.logs import show_logs
from rankguard.cli.main import main
from rankguard.launcher.ranklogs import RankLogs, find_rank_logs, index_name, recording_logs_specs


def _envs(node: int, ranks: list[int], attempt: int = 0) -> dict[int, dict[str, str]]:
    return {
        local: {
            "RANK": str(rank),
            "GROUP_RANK": str(node),
            "TORCHELASTIC_RUN_ID": "job",
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
        }
        for local, rank in enumerate(ranks)
    }


def test_the_index_maps_global_ranks_to_torchs_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    inner = DefaultLogsSpecs(log_dir=str(tmp_path / "torch"), redirects=Std.ALL)
    specs = recording_logs_specs(inner, run_dir)
    assert specs.root_log_dir == inner.root_log_dir
    dest = specs.reify(_envs(1, [2, 3]))
    rec = find_rank_logs(run_dir, 3)
    assert rec == RankLogs(
        rank=3,
        node=1,
        local_rank=1,
        attempt=0,
        stdout=dest.stdouts[1],
        stderr=dest.stderrs[1],
        error_file=dest.error_files[1],
    )
    assert (run_dir / index_name(1)).is_file()
    # a restart: the index follows the new attempt's files
    specs.reify(_envs(1, [2, 3], attempt=1))
    assert "attempt_1" in find_rank_logs(run_dir, 2).stdout  # type: ignore[union-attr]
    assert find_rank_logs(run_dir, 0) is None


def test_logs_prints_the_ranks_streams(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    specs = recording_logs_specs(
        DefaultLogsSpecs(log_dir=str(tmp_path / "t"), tee=Std.ALL), run_dir
    )
    dest = specs.reify(_envs(0, [0, 1]))
    Path(dest.stdouts[1]).write_text("out of rank 1\n")
    Path(dest.stderrs[1]).write_text("err of rank 1")
    assert main(["logs", str(run_dir), "--rank", "1"]) == 0
    shown = capsys.readouterr().out
    assert "out of rank 1\n" in shown and "err of rank 1\n" in shown
    assert shown.index("stdout") < shown.index("stderr")
    code, text = show_logs(run_dir, 1, "stderr")
    assert code == 0 and text == "err of rank 1\n"


def test_logs_says_why_it_cannot(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, text = show_logs(tmp_path / "nope", 0)
    assert code == 2 and "no such run directory" in text
    code, text = show_logs(run_dir, 0)
    assert code == 2 and "in no log index" in text
    # not redirected: the console only
    recording_logs_specs(DefaultLogsSpecs(log_dir=str(tmp_path / "t")), run_dir).reify(
        _envs(0, [0])
    )
    code, text = show_logs(run_dir, 0)
    assert code == 2 and "--tee 3" in text
    # a file that is not here (another node's disk)
    specs = recording_logs_specs(
        DefaultLogsSpecs(log_dir=str(tmp_path / "u"), redirects=Std.ALL), run_dir
    )
    dest = specs.reify(_envs(0, [0]))
    assert not os.path.exists(dest.stdouts[0])  # the rank never wrote it here
    code, text = show_logs(run_dir, 0, "stdout")
    assert code == 2 and "on its node" in text and text.count("\n") == 1
    (run_dir / index_name(5)).write_text("{not json")
    code, text = show_logs(run_dir, 9)
    assert code == 2 and "cannot read" in text
