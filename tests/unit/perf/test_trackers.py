"""Trackers as perf sinks: config, selection, and each tracker's files read back with the
tracker's own package (TensorBoard's EventAccumulator, W&B's record protobufs, MLflow's
client)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import rankguard.perf.trackers as trackers
from rankguard.config import ConfigError, load_config
from rankguard.perf.config import MlflowConfig, PerfConfig, TensorBoardConfig, WandbConfig
from rankguard.perf.sinks import RunInfo, SinkSet
from rankguard.perf.trackers import build_trackers
from rankguard.perf.trackers.common import (
    event_line,
    goodput_scalars,
    scalars,
    summary_scalars,
)
from tests.trackers_read import mlflow_metrics, tensorboard_scalars, wandb_history

INFO = RunInfo(run_id="run-7", rank=0, world_size=2)
WINDOWS = [
    {
        "iteration": it,
        "step": it,
        "step_time_ms": 10.0 + it,
        "tokens_per_sec": 1000.0,
        "MFU": None,
        "memory_GB": 0.5,
    }
    for it in (1, 5, 10)
]
GOODPUT = {
    "final": False,
    "ettr": 0.75,
    "wall_s": 40.0,
    "parts_s": {"productive": 30.0, "startup": 10.0, "Bad Name": 1.0},
}
SUMMARY = {"final_statistics": {"avg_step_time_ms": 15.0, "avg_mfu": None}}


def _on_thread(fn: Any) -> None:
    """Run ``fn`` on another thread (as the tracker thread does), re-raising its error."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(90)
    assert not t.is_alive()
    if err:
        raise err[0]


def _feed(sink: Any) -> None:
    sink.open(INFO)
    for w in WINDOWS:
        sink.window(w)
    sink.event("finding", 5, {"finding_type": "rank_hung", "rank": 1, "message": "no progress"})
    sink.event("restart", None, {"kind": "process", "restart": 1, "cause": "rank_hung"})
    sink.event("goodput", None, GOODPUT)
    sink.close(SUMMARY)


# ---- config and selection ----------------------------------------------------------


def test_config_lists_trackers_and_refuses_what_it_does_not_know() -> None:
    cfg = load_config(None, ["perf.trackers=tensorboard,mlflow", "perf.wandb.mode=offline"])
    assert cfg.perf.trackers == ["tensorboard", "mlflow"]
    assert load_config(None, ["perf.trackers="]).perf.trackers == []
    with pytest.raises(ConfigError, match=r"perf.trackers: unknown 'comet'"):
        load_config(None, ["perf.trackers=comet"])
    with pytest.raises(ConfigError, match=r"perf.wandb.projekt"):
        load_config(None, ["perf.wandb.projekt=x"])
    with pytest.raises(ConfigError, match=r"perf.tracker_ranks"):
        load_config(None, ["perf.tracker_ranks=some"])
    with pytest.raises(ValueError, match="each tracker at most once"):
        PerfConfig(trackers=["wandb", "wandb"])
    with pytest.raises(ValueError, match="mode"):
        WandbConfig(mode="online-ish")
    with pytest.raises(ValueError, match="flush_secs"):
        TensorBoardConfig(flush_secs=0)
    with pytest.raises(ValueError, match="tracking_uri"):
        MlflowConfig(tracking_uri=" ")


def test_settings_that_cannot_take_effect_are_said() -> None:
    cfg = load_config(None, ["perf.wandb.project=p", "perf.trackers=tensorboard"])
    assert any("perf.wandb is set but wandb is not in perf.trackers" in w for w in cfg.warnings())
    off = load_config(None, ["perf.enabled=false", "perf.trackers=mlflow"])
    assert any("perf.trackers=mlflow has NO effect" in w for w in off.warnings())
    assert not load_config(None, ["perf.trackers=wandb", "perf.wandb.project=p"]).perf.warnings()


def test_rank_zero_by_default_every_rank_on_request(tmp_path: Path) -> None:
    cfg = PerfConfig(trackers=["tensorboard", "wandb", "mlflow"])
    assert [s.name for s in build_trackers(cfg, rank=0, perf_dir=tmp_path)] == [
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    assert build_trackers(cfg, rank=1, perf_dir=tmp_path) == []
    every = PerfConfig(trackers=["tensorboard"], tracker_ranks="all")
    assert [s.name for s in build_trackers(every, rank=3, perf_dir=tmp_path)] == ["tensorboard"]
    assert build_trackers(PerfConfig(), rank=0, perf_dir=tmp_path) == []


def test_a_missing_package_is_one_loud_line_and_no_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trackers, "installed", lambda package: package != "wandb")
    with caplog.at_level(logging.WARNING, logger="rankguard.perf.trackers"):
        sinks = build_trackers(
            PerfConfig(trackers=["wandb", "tensorboard"]), rank=0, perf_dir=tmp_path
        )
    assert [s.name for s in sinks] == ["tensorboard"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "pip install 'rankguard[wandb]'" in lines[0]
    assert "NOTHING goes to wandb" in lines[0]


def test_common_names_and_lines() -> None:
    assert scalars(WINDOWS[0]) == {
        "perf/step_time_ms": 11.0,
        "perf/tokens_per_sec": 1000.0,
        "perf/memory_GB": 0.5,
    }
    assert "rankguard/perf/step_time_ms" in scalars(WINDOWS[0], "rankguard/")
    assert summary_scalars(SUMMARY) == {"summary/avg_step_time_ms": 15.0}
    line = event_line("finding", {"finding_type": "rank_hung", "rank": 3, "message": "m"})
    assert line == "rank_hung rank 3: m"
    ckpt = event_line("checkpoint", {"tier": "persistent", "step": 20, "total_s": 1.5})
    assert ckpt == "checkpoint step 20 (persistent) committed in 1.5 s"
    assert len(event_line("finding", {"message": "x" * 5000})) == 1000
    assert goodput_scalars(GOODPUT, "rankguard/") == {
        "rankguard/goodput/ettr": 0.75,
        "rankguard/goodput/wall_s": 40.0,
        "rankguard/goodput/productive_s": 30.0,
        "rankguard/goodput/startup_s": 10.0,
    }


# ---- each tracker, read back -------------------------------------------------------


def test_tensorboard_scalars_at_their_iterations(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    (sink,) = build_trackers(
        PerfConfig(trackers=["tensorboard"]), rank=0, perf_dir=tmp_path / "perf"
    )
    sinks = SinkSet([sink])
    _on_thread(lambda: _feed(sinks))
    assert sinks.errors == {}
    got = tensorboard_scalars(tmp_path / "perf" / "tensorboard")
    assert got["perf/step_time_ms"] == [(1, 11.0), (5, 15.0), (10, 20.0)]
    assert [s for s, _ in got["perf/tokens_per_sec"]] == [1, 5, 10]
    assert "perf/MFU" not in got  # None: left out, not 0
    assert got["events/findings"] == [(5, 1.0)]
    assert got["events/restarts"] == [(10, 1.0)]  # no step of its own: the last window's
    assert got["summary/avg_step_time_ms"] == [(10, 15.0)]
    assert got["goodput/ettr"] == [(10, 0.75)] and got["goodput/startup_s"] == [(10, 10.0)]
    assert "events/goodputs" not in got  # scalars, not a counted event


def test_wandb_logs_into_the_scripts_run_under_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="script", dir=str(tmp_path), name="the-script")
    try:
        run.log({"loss": 1.0})
        (sink,) = build_trackers(PerfConfig(trackers=["wandb"]), rank=0, perf_dir=tmp_path)
        sinks = SinkSet([sink])
        _on_thread(lambda: _feed(sinks))
        assert sinks.errors == {}
        assert sink.attached and wandb.run is run  # the script's run stays open
        run.log({"loss": 0.5})
    finally:
        run.finish()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows = wandb_history(run_file)
    ours = [r for r in rows if "rankguard/perf/step_time_ms" in r]
    assert [(r["rankguard/step"], r["rankguard/perf/step_time_ms"]) for r in ours] == [
        (1, 11),
        (5, 15),
        (10, 20),
    ], rows
    assert not any(k.startswith("perf/") for r in rows for k in r)  # nothing unprefixed
    assert [r["loss"] for r in rows if "loss" in r] == [1.0, 0.5]
    findings = [r for r in rows if "rankguard/events/findings" in r]
    assert findings[0]["rankguard/step"] == 5
    assert findings[0]["rankguard/events/last_finding"] == "rank_hung rank 1: no progress"
    (ledger,) = [r for r in rows if "rankguard/goodput/ettr" in r]
    assert ledger["rankguard/step"] == 10 and ledger["rankguard/goodput/productive_s"] == 30


def _file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's local store, no server
    return (tmp_path / "mlruns").as_uri()


def test_mlflow_own_run_read_back_with_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = _file_store(tmp_path, monkeypatch)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    cfg = PerfConfig(trackers=["mlflow"], mlflow=MlflowConfig(tracking_uri=uri, experiment="exp"))
    (sink,) = build_trackers(cfg, rank=0, perf_dir=tmp_path)
    sinks = SinkSet([sink])
    _on_thread(lambda: _feed(sinks))
    assert sinks.errors == {}
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == "run-7" and run.info.status == "FINISHED"
    assert run.data.params["rankguard.world_size"] == "2"
    got = mlflow_metrics(
        uri, run.info.run_id, ["perf/step_time_ms", "events/findings", "goodput/ettr"]
    )
    assert got["perf/step_time_ms"] == [(1, 11.0), (5, 15.0), (10, 20.0)]
    assert got["events/findings"] == [(5, 1.0)]
    assert got["goodput/ettr"] == [(10, 0.75)]
    assert run.data.metrics["summary/avg_step_time_ms"] == 15.0


def test_mlflow_logs_into_the_main_threads_active_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = _file_store(tmp_path, monkeypatch)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(run_name="script") as active:
            (sink,) = build_trackers(PerfConfig(trackers=["mlflow"]), rank=0, perf_dir=tmp_path)
            sinks = SinkSet([sink])
            _on_thread(lambda: _feed(sinks))  # another thread: MLflow's runs are per thread
            assert sinks.errors == {} and sink.attached
            assert MlflowClient(uri).get_run(active.info.run_id).info.status == "RUNNING"
    finally:
        mlflow.set_tracking_uri("")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(active.info.run_id)
    assert run.info.status == "FINISHED"  # ended by the script, not by rankguard
    assert "perf/step_time_ms" not in run.data.metrics
    got = mlflow_metrics(uri, active.info.run_id, ["rankguard/perf/step_time_ms"])
    assert got["rankguard/perf/step_time_ms"] == [(1, 11.0), (5, 15.0), (10, 20.0)]
