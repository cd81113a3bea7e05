"""``rankguard demo`` (the README's first command): the launch it asks for, with the
launcher replaced by a fake. What that launch does end to end, the demo's module under
``rankguard run`` with the demo's short timeouts, is the shared healthy run's
(``tests/e2e/test_run_e2e.py::test_normal_run_has_no_findings_and_ends_completed``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankguard.cli.main import main
from rankguard.config import RankguardConfig
from rankguard.launcher.options import LaunchOptions


def _demo(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[Any]]:
    import rankguard.launcher.run as run

    launched: list[Any] = []

    def fake_launch(opts: LaunchOptions, cfg: RankguardConfig) -> int:
        launched.append((opts, cfg))
        return 0

    monkeypatch.setattr(run, "launch", fake_launch)
    return main(["demo", *argv]), launched


def test_the_readme_command_launches_the_demo_module_on_two_local_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, launched = _demo(["--steps", "12", "--log-dir", str(tmp_path)], monkeypatch)
    assert code == 0
    ((opts, cfg),) = launched
    assert (opts.target, opts.module, opts.nproc_per_node) == ("rankguard.demo.train", True, 2)
    assert opts.standalone and opts.live_status and opts.max_restarts == 0
    assert opts.preload == ()
    args = opts.target_args
    assert args[args.index("--steps") + 1] == "12"
    assert args[args.index("--fault") + 1] == "none"
    # the files where the user said, the short timeouts that show a fault within seconds
    assert cfg.log_dir == str(tmp_path)
    hb = cfg.heartbeat
    assert hb.enabled and (hb.publish_interval_s, hb.scan_interval_s) == (0.5, 0.5)
    assert (hb.process_timeout_s, hb.progress_timeout_s) == (3, 4)
    assert (hb.initial_process_timeout_s, hb.initial_progress_timeout_s) == (30, 60)
    assert hb.checkpoint_timeout_s == 20


def test_a_fault_rank_outside_the_job_is_refused_before_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, launched = _demo(
        ["--fault", "crash", "--fault-rank", "2", "--log-dir", str(tmp_path)], monkeypatch
    )
    assert (code, launched) == (2, [])
    assert "--fault-rank must be in [0, 2)" in capsys.readouterr().out
