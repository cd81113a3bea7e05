"""End to end: unmodified Hugging Face Trainer and Lightning scripts (neither imports
rankguard) under ``rankguard run`` with an evaluation and a save each longer than the
progress timeout: no finding, the phases recognised; nanoGPT evaluating before its first
step under NVRx's setup section (the console's first line names it). The phase logic itself (a
nanoGPT-style loop, a hang inside an evaluation) is tested with ranks as threads in
``tests/tier2/test_phases_tier2.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import skip_unless_installed

from .conftest import SCRIPTS, read_jsonl, read_status, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# FAST settings (progress 4 s) made shorter: progress 3 s; each slow part lasts 4 s.
PHASES = [
    "--set",
    "heartbeat.progress_timeout_s=3",
    "--set",
    "heartbeat.eval_timeout_s=20",
]
SLOW_S = "4"
# Megatron's launch line, scaled down (setup:600,step:180,checkpointing:420 / 300).
MEGATRON = [
    "--ft-rank_section_timeouts=setup:60,step:3,checkpointing:20",
    "--ft-rank_out_of_section_timeout",
    "20",
]


def _run(
    tmp_path: Path, run_id: str, script: str, *script_args: str, flags: tuple[str, ...] = ()
) -> tuple[Path, str]:
    res = run_rankguard(
        [*standalone_run(run_id, tmp_path), *PHASES, *flags, str(SCRIPTS / script), *script_args],
        timeout=150,
    )
    out = res.stdout + res.stderr
    run_dir = tmp_path / "heartbeat" / run_id
    assert run_dir.is_dir(), out
    return run_dir, out


def _phases_published(run_dir: Path, rank: int) -> set[str]:
    (path,) = run_dir.glob(f"rank_{rank}_pid_*.heartbeat.jsonl")
    return {r["phase"] for r in read_jsonl(path) if r.get("phase")}


def _assert_healthy(run_dir: Path, out: str, done: str) -> dict:
    assert done in out, out
    assert read_jsonl(run_dir / "findings.jsonl") == [], out
    status = read_status(run_dir)
    assert status["state"] == "completed", out
    for row in status["ranks"]:
        assert row["phase"] == "train"
        assert row["active_findings"] == []
    return status


def test_nanogpt_evaluating_before_its_first_step_with_a_setup_section(
    tmp_path: Path, run_id: str
) -> None:
    """nanoGPT evaluates at iteration 0, before any optimizer step: rank 0's 12 s
    estimate_loss() against NVRx's setup section of 10 s is an evaluation (eval timeout
    20 s), and rank 1, waiting for it in its first step, is blocked by it: no finding."""
    run_dir, out = _run(
        tmp_path,
        run_id,
        "nanogpt_style.py",
        "--max-iters=3",
        "--eval-interval=100",
        "--eval-at-start",
        "--eval-sleep=12",
        f"--out-dir={tmp_path / 'out'}",
        flags=("--ft-rank_section_timeouts=setup:10,step:3",),
    )
    status = _assert_healthy(run_dir, out, "nanogpt_style done: 4 iterations")
    assert "eval" in status["ranks"][0]["phases_seen"], status["ranks"][0]
    assert "eval" in _phases_published(run_dir, 0)
    assert "NVRx section timeouts setup 10 s, step 3 s" in out  # what the first line says


def test_hf_trainer_slow_eval_and_save(tmp_path: Path, run_id: str) -> None:
    """A real launch: the Trainer's own distributed set-up and its eval/save functions,
    as they are named in the installed transformers, recognised in real ranks."""
    skip_unless_installed("transformers", "accelerate")
    run_dir, out = _run(
        tmp_path,
        run_id,
        "hf_trainer.py",
        f"--output-dir={tmp_path / 'hf'}",
        "--max-steps=6",
        "--eval-steps=6",
        "--save-steps=6",
        f"--eval-sleep={SLOW_S}",
        f"--save-sleep={SLOW_S}",
    )
    status = _assert_healthy(run_dir, out, "hf_trainer done: 6 steps")
    for rank in (0, 1):
        assert {"eval", "checkpointing", "train"} <= set(status["ranks"][rank]["phases_seen"])


def test_lightning_slow_validation_and_checkpoint_megatron_sections(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch: Lightning's strategy starts its own process group from the
    launcher's variables; its loops, as installed, recognised in real ranks, and the
    Megatron-style section flags parsed from the command line."""
    skip_unless_installed("lightning")
    run_dir, out = _run(
        tmp_path,
        run_id,
        "lightning_module.py",
        f"--default-root-dir={tmp_path / 'pl'}",
        "--max-steps=6",
        "--val-every=3",
        f"--eval-sleep={SLOW_S}",
        f"--save-sleep={SLOW_S}",
        flags=(*MEGATRON, "--set", "perf.log_interval=2"),
    )
    status = _assert_healthy(run_dir, out, "lightning_module done: 6 steps")
    for rank in (0, 1):
        assert {"eval", "checkpointing", "train"} <= set(status["ranks"][rank]["phases_seen"])
    # one numbering, the trainer's global step: perf lines, status and summary agree
    perf = tmp_path / "perf_monitor" / run_id
    assert [e["iteration"] for e in read_jsonl(perf / "perf.jsonl")] == [1, 2, 4, 6], out
    assert {(r["iteration"], r["iteration_source"]) for r in status["ranks"]} == {(6, "script")}
    (summary_path,) = perf.glob("perf_summary_*.json")
    info = json.loads(summary_path.read_text(encoding="utf-8"))["session_info"]
    assert info["total_iterations"] == 6
    # the validation and save at step 3 are left out of the next step's time
    assert info["steps_with_eval_or_save"] == 1, info
