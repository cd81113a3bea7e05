"""End to end: one 2-rank demo run with TensorBoard, W&B (offline) and MLflow (a local
SQLite store) as ``perf.trackers`` (the shared healthy run, ``conftest.healthy_run``);
each tracker's files read back with its own package: the perf windows at their
iterations and the checkpoint events of the run directory."""

from __future__ import annotations

import pytest

from tests.trackers_read import mlflow_metrics, tensorboard_scalars, wandb_history

from .conftest import HEALTHY_RUN, HealthyRun, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ITERATIONS = [1, 5, 10, 15, 20]


@HEALTHY_RUN
def test_demo_run_to_tensorboard_wandb_and_mlflow(healthy_run: HealthyRun) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    assert healthy_run.trackers
    tmp_path, log_dir, run_id = healthy_run.tmp, healthy_run.log_dir, healthy_run.run_id
    uri = healthy_run.mlflow_uri
    res, out = healthy_run.res, healthy_run.out
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
