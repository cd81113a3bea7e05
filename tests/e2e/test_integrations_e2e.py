"""End to end: performance numbers of an unmodified script, ``rankguard.init()`` under
plain torchrun, and the Hugging Face and Lightning integrations under ``rankguard run``
(2 CPU ranks on gloo, a save longer than the progress timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rankguard.perf.flops import ModelShape, analytic_flops_per_step
from tests.factories import (
    LIGHTNING_FACTORY,
    lightning_entry_point_installed,
    skip_unless_installed,
)

from .conftest import SCRIPTS, read_jsonl, read_status, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e]

# perf_nanogpt.py's model and batch
NANO = ModelShape(
    family="gpt",
    num_layers=2,
    hidden_size=128,
    seq_length=32,
    vocab_size=256,
    num_attention_heads=4,
)
BATCH, ACCUM, WORLD = 4, 2, 2


def _summary(perf_dir: Path) -> dict[str, Any]:
    (path,) = perf_dir.glob("perf_summary_*.json")
    return dict(json.loads(path.read_text()))


def _check_nanogpt_summary(summary: dict[str, Any]) -> None:
    """tokens/s and TFLOP/s within 10 % of the analytic values for the measured step time."""
    info, stats = summary["session_info"], summary["final_statistics"]
    assert info["batch_source"].startswith("detected: DistributedDataParallel input 4 x 32")
    step_s = stats["avg_step_time_ms"] / 1e3
    global_batch = BATCH * ACCUM * WORLD
    tokens_per_s = global_batch * NANO.seq_length / step_s
    tflops = analytic_flops_per_step(NANO, global_batch) / (step_s * 1e12 * WORLD)
    assert stats["avg_tokens_per_sec"] == pytest.approx(tokens_per_s, rel=0.10)
    assert stats["avg_samples_per_sec"] == pytest.approx(global_batch / step_s, rel=0.10)
    assert stats["avg_tflops_per_gpu"] == pytest.approx(tflops, rel=0.10)


@pytest.mark.timeout(150)
def test_unmodified_nanogpt_gets_progress_tokens_and_measured_tflops(
    tmp_path: Path, run_id: str
) -> None:
    """A real launch of a script that never imports rankguard, its ranks forked from the
    ``--preload`` fork server: progress from the optimizer hook the rank bootstrap
    installs, the batch detected from DDP's input and the FLOPs counted by global module
    hooks, one detector per rank process (not possible with ranks as threads); the
    script's exit handlers run in every rank (a forked rank runs them explicitly). The
    analytic FLOPs of the same script: ``test_init_under_plain_torchrun_measures_in_rank``;
    the bootstrap of a script that counts no step in a subprocess per rank (no
    ``--preload``): ``test_truth_e2e`` (the optimizer hook's steps before the kill)."""
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            "--preload",
            "torch",
            str(SCRIPTS / "perf_nanogpt.py"),
            "--steps",
            "20",
            "--no-config",
            "--atexit-dir",
            str(tmp_path),
        ],
        timeout=120,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "ranks are forked from a fork server" in out, out
    assert sorted(p.name for p in tmp_path.glob("atexit_rank_*")) == [
        "atexit_rank_0",
        "atexit_rank_1",
    ]
    summary = _summary(tmp_path / "perf_monitor" / run_id)
    assert summary["session_info"]["flops_source"].startswith("measured")
    _check_nanogpt_summary(summary)
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_jsonl(run_dir / "findings.jsonl") == []
    status = read_status(run_dir)
    assert status["state"] == "completed", out
    for row in status["ranks"]:
        assert row["progress_seq"] == 20
        assert row["progress_source"] == "optimizer_hook"
        # not the script's numbering: said as the steps this process counted
        assert (row["iteration"], row["iteration_source"]) == (20, "steps")


@pytest.mark.timeout(150)
def test_init_under_plain_torchrun_measures_in_rank(tmp_path: Path) -> None:
    """A real launch by plain torchrun: ``rankguard.init()`` with no rankguard launcher."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(SCRIPTS / "perf_nanogpt.py"),
            "--steps",
            "20",
            "--rankguard-init",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert out.count("need the launcher: run this script with `rankguard run`") == 1
    (perf_dir,) = (tmp_path / "rankguard_logs" / "perf_monitor").iterdir()
    assert read_jsonl(perf_dir / "perf.jsonl")
    summary = _summary(perf_dir)
    assert summary["session_info"]["flops_source"].startswith("analytic")
    _check_nanogpt_summary(summary)
    assert not (tmp_path / "rankguard_logs" / "heartbeat").exists()  # no monitor, no files


def _phases(run_dir: Path) -> dict[int, set[str]]:
    """The phases each rank published, but ``closing`` (the session's close after the
    script returned: published when it lasts long enough)."""
    seen: dict[int, set[str]] = {}
    for path in run_dir.glob("rank_*_pid_*.heartbeat.jsonl"):
        for rec in read_jsonl(path):
            if rec.get("phase") and rec["phase"] != "closing":
                seen.setdefault(rec["rank"], set()).add(rec["phase"])
    return seen


def _preload(modules: str) -> list[str]:
    """The library imported once by ``--preload``'s fork server, both ranks forked from
    it: each rank's own import of it cost 5-6 s of CPU (transformers' Trainer, Lightning),
    paid twice per launch. Its first heartbeat then comes after the server's imports, not
    before the script's: the first-heartbeat timeout covers them on a loaded machine (the
    subject here is the progress timeout against a longer save, not the start)."""
    return ["--preload", modules, "--set", "heartbeat.initial_process_timeout_s=120"]


def _check_integration_run(
    res: subprocess.CompletedProcess[str], tmp_path: Path, run_id: str
) -> dict[str, Any]:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    run_dir = tmp_path / "heartbeat" / run_id
    assert read_jsonl(run_dir / "findings.jsonl") == [], out  # a 5 s save, a 4 s timeout
    assert _phases(run_dir) == {r: {"setup", "train", "eval", "checkpointing"} for r in (0, 1)}
    status = read_status(run_dir)
    assert status["state"] == "completed" and status["recent_findings"] == []
    for rank in status["ranks"]:  # the callback reports the steps (not the optimizer hook)
        assert (rank["phase"], rank["progress_source"], rank["iteration"]) == ("train", "api", 8)
    summary = _summary(tmp_path / "perf_monitor" / run_id)
    stats = summary["final_statistics"]
    assert stats["avg_tokens_per_sec"] and stats["avg_samples_per_sec"]
    return summary


@pytest.mark.timeout(180)
def test_hf_trainer_callback_under_rankguard_run(tmp_path: Path, run_id: str) -> None:
    """A real launch: the Trainer sets up torch's default process group from the
    launcher's variables, one per process."""
    skip_unless_installed("transformers", "accelerate")
    res = run_rankguard(
        [
            *standalone_run(run_id, tmp_path),
            *_preload("torch,transformers.trainer,transformers.models.gpt2.modeling_gpt2"),
            "--set",
            "perf.log_interval=2",
            str(SCRIPTS / "hf_trainer_callback.py"),
            "--out",
            str(tmp_path / "out"),
            "--steps",
            "8",
            "--save-s",
            "5",
            "--eval-s",
            "1",
        ],
        timeout=170,
    )
    summary = _check_integration_run(res, tmp_path, run_id)
    info = summary["session_info"]
    assert info["batch_source"].startswith("hf: Trainer arguments")
    assert info["flops_source"].startswith("analytic: gpt formula from GPT2LMHeadModel.config")
    assert summary["final_statistics"]["avg_tflops_per_gpu"]
    assert info["dtype"] == "fp32"  # the model's parameters, not perf.dtype's bf16
    assert "'rankguard/tokens_per_sec'" in res.stdout  # in the Trainer's own logs
    status = json.loads((tmp_path / "heartbeat" / run_id / "status.json").read_text())
    assert {(r["iteration"], r["iteration_source"]) for r in status["ranks"]} == {(8, "script")}


@pytest.mark.timeout(180)
def test_lightning_callback_from_the_entry_point(tmp_path: Path, run_id: str) -> None:
    """The script never mentions rankguard: Lightning loads the callback from the
    ``lightning.pytorch.callbacks_factory`` entry point the package declares (a copy of
    it on the path here, as ``pip install`` would write it)."""
    skip_unless_installed("lightning")
    site = tmp_path / "site" / "rankguard_e2e_entry_point-0.dist-info"
    site.mkdir(parents=True)
    if not lightning_entry_point_installed():  # installed from an older tree: stand in
        (site / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: rankguard-e2e-ep\nVersion: 0\n"
        )
        (site / "entry_points.txt").write_text(
            f"[lightning.pytorch.callbacks_factory]\nrankguard = {LIGHTNING_FACTORY}\n"
        )
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(site.parent)) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankguard.cli.main",
            *standalone_run(run_id, tmp_path),
            *_preload("torch,lightning.pytorch"),
            "--set",
            "perf.log_interval=2",
            str(SCRIPTS / "lightning_callback.py"),
            "--out",
            str(tmp_path / "out"),
            "--steps",
            "8",
            "--save-s",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    summary = _check_integration_run(res, tmp_path, run_id)
    assert summary["session_info"]["batch_source"].startswith("lightning: first batch 4 x 16")
    # a LightningModule without a known config: its first training step's FLOPs, counted
    # under the DDP strategy while it ran, give TFLOP/s
    info = summary["session_info"]
    assert info["flops_source"].startswith(
        "measured: FlopCounterMode over the first training_step (forward and backward) x "
        "world_size 2"
    ), info
    assert summary["final_statistics"]["avg_tflops_per_gpu"] > 0
    assert (info["dtype"], info["dtype_source"]) == ("fp32", "lightning: parameters of TinyLM")
    assert "callbacks ['RankguardCallback', 'ModelCheckpoint']" in res.stdout
    (metrics,) = (tmp_path / "out").rglob("metrics.csv")
    assert "rankguard/tokens_per_sec" in metrics.read_text().splitlines()[0]
