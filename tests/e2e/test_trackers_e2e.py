"""End to end: one 2-rank demo run with TensorBoard, W&B (offline) and MLflow (a local
SQLite store) as ``perf.trackers``; each tracker's files read back with its own package:
the perf windows at their iterations and the checkpoint events of the run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trackers_read import mlflow_metrics, tensorboard_scalars, wandb_history

from .conftest import read_jsonl, run_rankguard, standalone_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ITERATIONS = [1, 5, 10, 15, 20]


def test_demo_run_to_tensorboard_wandb_and_mlflow(
    tmp_path: Path, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # MLflow's artifacts and W&B's files stay in the test's dir
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_dir = tmp_path / "logs"
    res = run_rankguard(
        [
            *standalone_run(run_id, log_dir),
            "--set",
            "perf.log_interval=5",
            "--set",
            "perf.trackers=tensorboard,wandb,mlflow",
            "--set",
            f"perf.wandb.dir={tmp_path / 'wb'}",
            "--set",
            "perf.wandb.project=rankguard-e2e",
            "--set",
            f"perf.mlflow.tracking_uri={uri}",
            "--set",
            "perf.mlflow.experiment=rankguard-e2e",
            "-m",
            "rankguard.demo.train",
            "--steps",
            "20",
            "--checkpoint-every",
            "10",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ],
        timeout=200,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "sink" not in out and "NOTHING goes to" not in out, out  # no tracker failed
    perf = read_jsonl(log_dir / "perf_monitor" / run_id / "perf.jsonl")
    assert [e["iteration"] for e in perf] == ITERATIONS
    step_ms = {e["iteration"]: e["step_time_ms"] for e in perf}

    # TensorBoard: rank 0's event files, read with TensorBoard's EventAccumulator
    tb = tensorboard_scalars(log_dir / "perf_monitor" / run_id / "tensorboard")
    assert [s for s, _ in tb["perf/step_time_ms"]] == ITERATIONS
    for step, value in tb["perf/step_time_ms"]:
        assert value == pytest.approx(step_ms[step], rel=1e-5)
    assert [s for s, _ in tb["perf/tokens_per_sec"]] == ITERATIONS
    assert tb["events/checkpoints"] == [(10, 1.0), (20, 2.0)]

    # W&B: the offline run's record file, W&B's own protobufs
    (run_file,) = (tmp_path / "wb").glob("wandb/offline-run-*/run-*.wandb")
    rows = wandb_history(run_file)
    windows = [r for r in rows if "perf/step_time_ms" in r]
    assert [r["step"] for r in windows] == ITERATIONS
    for r in windows:
        assert r["perf/step_time_ms"] == pytest.approx(step_ms[r["step"]], rel=1e-5)
    assert [r["step"] for r in rows if "events/checkpoints" in r] == [10, 20]

    # MLflow: the run in the local store, read with MlflowClient
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("rankguard-e2e").experiment_id])
    assert run.info.run_name == run_id and run.info.status == "FINISHED"
    got = mlflow_metrics(uri, run.info.run_id, ["perf/step_time_ms", "events/checkpoints"])
    assert [s for s, _ in got["perf/step_time_ms"]] == ITERATIONS
    assert got["events/checkpoints"] == [(10, 1.0), (20, 2.0)]
