"""CheckpointManager in one process: save/load round trips of both tiers, async writes,
verification and fallback, retention, and every bad input or fault with its message."""

from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from rankguard.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    CheckpointManager,
    DataPosition,
    RNGState,
)
from rankguard.checkpoint.files import COMMIT_MARKER, LOCK_FILE, MANIFEST_FILE
from rankguard.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)


class Trainer:
    """A tiny model, its optimizer, scheduler, data position and RNG streams."""

    def __init__(self, out: int = 2, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, out))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 3)
        self.data = DataPosition()

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "optim": self.opt,
            "sched": self.sched,
            "data": self.data,
            "rng": RNGState(),
        }

    def step(self) -> float:
        x = torch.randn(5, 4)
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.data.index += 1
        return float(loss.detach())


def cfg(tmp_path: Path, **kw: Any) -> CheckpointConfig:
    return CheckpointConfig(save=str(tmp_path / "ckpt"), **kw)


def manager(config: CheckpointConfig, trainer: Trainer, **kw: Any) -> CheckpointManager:
    kw.setdefault("job_id", "job-a")
    kw.setdefault("session", False)
    return CheckpointManager(config, trainer.state(), **kw)


def weights(t: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_round_trip_restores_every_piece_and_the_run_continues_identically(
    tmp_path: Path, async_save: bool
) -> None:
    config = cfg(tmp_path, async_save=async_save, save_interval=3)
    a = Trainer()
    with manager(config, a) as m:
        for step in range(1, 7):
            a.step()
            m.maybe_save(step)
        m.wait()
        assert m.last_committed == {"persistent": 6, "local": None}
    saved, lr = weights(a), a.sched.get_last_lr()
    rng = (torch.get_rng_state(), random.getstate())
    expected_loss = a.step()
    random.random()
    b = Trainer(seed=99)
    with manager(config, b) as m:
        assert m.load_latest() == 6
    assert same(weights(b), saved) and b.sched.get_last_lr() == lr
    assert b.data.index == 6
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]
    # optimizer moments and RNG too: the next step is the same step
    assert b.step() == pytest.approx(expected_loss, rel=1e-6)


def test_no_checkpoint_loads_nothing(tmp_path: Path) -> None:
    t = Trainer()
    before = weights(t)
    with manager(cfg(tmp_path), t) as m:
        assert m.load_latest() is None
    assert same(before, weights(t))


def test_files_manifest_and_marker(tmp_path: Path) -> None:
    with manager(cfg(tmp_path, checksum="blake2b"), Trainer()) as m:
        m.save(5)
    d = tmp_path / "ckpt" / "step_000000005"
    manifest = json.loads((d / MANIFEST_FILE).read_text())
    assert manifest["step"] == 5 and manifest["checksum"] == "blake2b"
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp", "rank_0.state"}
    for name, entry in manifest["files"].items():
        assert (d / name).stat().st_size == entry["size"]
    marker = json.loads((d / COMMIT_MARKER).read_text())
    assert marker["step"] == 5 and marker["tier"] == "persistent"
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp_")]


def _two_saves(tmp_path: Path, **kw: Any) -> tuple[Trainer, list[torch.Tensor]]:
    t = Trainer()
    with manager(cfg(tmp_path, **kw), t) as m:
        t.step()
        m.save(1)
        first = weights(t)
        t.step()
        m.save(2)
    return t, first


def _newest(tmp_path: Path) -> Path:
    return tmp_path / "ckpt" / "step_000000002"


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "marker", "missing"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_warning(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, first = _two_saves(tmp_path)
    newest = _newest(tmp_path)
    shard = newest / "__0_0.distcp"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    elif damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "manifest":
        doc = json.loads((newest / MANIFEST_FILE).read_text())
        doc["files"]["__0_0.distcp"]["size"] += 1
        (newest / MANIFEST_FILE).write_text(json.dumps(doc))
    elif damage == "marker":
        (newest / COMMIT_MARKER).unlink()  # torn: renamed but never marked
    else:
        shard.unlink()
    t = Trainer(seed=3)
    with manager(cfg(tmp_path), t) as m:
        assert m.load_latest() == 1
    assert same(weights(t), first)
    err = capsys.readouterr().err
    if damage != "marker":  # an unmarked directory is not a candidate at all
        assert "step 2" in err and "falling back" in err, err


class FullDiskWriter(FileSystemWriter):
    """DCP's file writer whose data write fails as on a full disk (fault injection)."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_disk_full_keeps_the_previous_checkpoint_latest_and_reports(
    tmp_path: Path, async_save: bool
) -> None:
    t = Trainer()
    config = cfg(tmp_path, async_save=async_save)
    with manager(config, t) as m:
        t.step()
        m.save(1)
        m.wait()
    kept = weights(t)
    full = manager(config, t, writer_factory=lambda p: FullDiskWriter(p))
    t.step()
    if async_save:
        full.save(2)  # returns: the write fails in the background ...
        with pytest.raises(CheckpointError, match="No space left") as info:
            full.save(3)  # ... and the next save says so
    else:
        with pytest.raises(CheckpointError, match="No space left") as info:
            full.save(2)
    assert "latest persistent checkpoint is still step 1" in str(info.value)
    assert full.last_committed["persistent"] == 1
    full.close()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith("."))
    assert names == ["step_000000001"]
    t2 = Trainer(seed=7)
    with manager(config, t2) as m:
        assert m.load_latest() == 1
    assert same(weights(t2), kept)


def test_a_failed_background_write_raises_at_close(tmp_path: Path) -> None:
    m = manager(
        cfg(tmp_path, async_save=True), Trainer(), writer_factory=lambda p: FullDiskWriter(p)
    )
    m.save(1)
    with pytest.raises(CheckpointError, match="No space left"):
        m.close()


def test_unwritable_directory_is_refused_at_construction(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="cannot write there") as info:
        CheckpointManager(CheckpointConfig(save=str(blocker / "ckpt")), Trainer().state())
    assert str(blocker) in str(info.value)


def test_loading_into_a_model_of_another_shape_names_the_key(tmp_path: Path) -> None:
    with manager(cfg(tmp_path), Trainer()) as m:
        m.save(1)
    with pytest.raises(CheckpointError, match=r"model\.1\.weight"):
        manager(cfg(tmp_path), Trainer(out=3)).load_latest()


def test_a_second_job_is_refused_while_the_first_holds_the_directory(tmp_path: Path) -> None:
    first = manager(cfg(tmp_path), Trainer(), job_id="job-a")
    with pytest.raises(CheckpointError, match="in use by job 'job-a'"):
        manager(cfg(tmp_path), Trainer(), job_id="job-b")
    again = manager(cfg(tmp_path), Trainer(), job_id="job-a")  # same job: a restart
    again.close()
    first.close()
    assert not (tmp_path / "ckpt" / LOCK_FILE).exists()
    manager(cfg(tmp_path), Trainer(), job_id="job-b").close()


def test_a_dead_owner_on_this_host_is_taken_over(tmp_path: Path) -> None:
    import socket

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / LOCK_FILE).write_text(
        json.dumps({"job": "old", "host": socket.gethostname(), "pid": 2**22 + 7})
    )
    manager(cfg(tmp_path), Trainer(), job_id="new").close()


def test_retention_keeps_the_newest_k_and_clears_stale_temporaries(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / ".tmp_step_000000009.a0s1").mkdir(parents=True)  # a killed writer's leftover
    t = Trainer()
    with manager(cfg(tmp_path, most_recent_k=2), t) as m:
        for step in range(1, 5):
            t.step()
            m.save(step)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "step_000000003",
        "step_000000004",
    ]
    assert not (root / ".tmp_step_000000009.a0s1").exists()


def test_local_tier_is_newer_than_persistent_and_wins(tmp_path: Path) -> None:
    config = cfg(
        tmp_path,
        save_interval=4,
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(tmp_path / "local"),
        non_persistent_save_interval=1,
        async_save=True,
    )
    t = Trainer()
    with manager(config, t) as m:
        for step in range(1, 7):
            t.step()
            m.maybe_save(step)
        m.wait()
        assert m.last_committed == {"persistent": 4, "local": 6}
    saved = weights(t)
    t2 = Trainer(seed=1)
    with manager(config, t2) as m:
        assert m.load_latest() == 6
    assert same(weights(t2), saved) and t2.data.index == 6
    held = sorted(p.name for p in (tmp_path / "local").iterdir() if p.name.startswith("step"))
    assert held == ["step_000000005", "step_000000006"]  # non_persistent_most_recent_k=2
    # the local directory gone (a lost node): the persistent tier is next
    import shutil

    shutil.rmtree(tmp_path / "local")
    t3 = Trainer(seed=2)
    with manager(config, t3) as m:
        assert m.load_latest() == 4


def test_torch_format_round_trip(tmp_path: Path) -> None:
    t = Trainer()
    with manager(cfg(tmp_path, ckpt_format="torch"), t) as m:
        t.step()
        m.save(1)
    t2 = Trainer(seed=4)
    with manager(cfg(tmp_path, ckpt_format="torch"), t2) as m:
        assert m.load_latest() == 1
    assert same(weights(t), weights(t2))


def test_config_errors_name_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"async_save.*checkpoint\.ckpt_format"):
        load_config(None, ["checkpoint.async_save=true", "checkpoint.ckpt_format=torch"])
    with pytest.raises(ConfigError, match=r"unknown config key.*checkpoint\.keep"):
        load_config(None, ["checkpoint.keep=3"])
    with pytest.raises(ConfigError, match="non_persistent_local_ckpt_dir"):
        load_config(None, ["checkpoint.non_persistent_ckpt_type=local"])
    with pytest.raises(ConfigError, match="replication_factor"):
        load_config(None, ["checkpoint.replication_factor=0"])
    with pytest.raises(ConfigError, match="most_recent_k"):
        load_config(None, ["checkpoint.most_recent_k=0"])
    cfg_ = load_config(None, ["checkpoint.replication=true"])
    assert any("replication=true has NO effect" in w for w in cfg_.warnings())


def test_state_without_state_dict_is_refused() -> None:
    with pytest.raises(ValueError, match=r"state\['x'\].*state_dict"):
        CheckpointManager(CheckpointConfig(save="/nonexistent-never"), {"x": object()})


def test_a_save_marks_the_checkpoint_phase_of_the_session(tmp_path: Path) -> None:
    from rankguard.session import Session
    from tests.factories import heartbeat_config, rank_identity

    session = Session(rank_identity(), tmp_path, heartbeat_config(), publish=False)
    seen = []

    class Probe(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            seen.append((session.tracker.phase, session.tracker.checkpoint_id))
            return super().write_data(plan, planner)

    t = Trainer()
    with manager(cfg(tmp_path), t, session=session, writer_factory=Probe) as m:
        m.save(7)
        assert seen == [("checkpointing", "persistent:step_000000007")]
        assert len(session.tracker.checkpoint_durations_ns) == 1  # learned timeouts see it
        assert session.tracker.phase != "checkpointing"
        m.load_latest()  # not a save: no progress step (agreed stop steps stay put)
    assert len(session.tracker.checkpoint_durations_ns) == 1


def test_waiting_for_a_background_write_is_checkpointing_without_progress(
    tmp_path: Path,
) -> None:
    """A wait for an async write still in flight (the next save, ``close()`` at the end
    of a run) is in the checkpointing phase, under its timeout, not the step's: a slow
    last write on a loaded machine was reported as a hang in train. The wait saved
    nothing: no progress, one save counted."""
    import time

    from rankguard.session import Session
    from tests.factories import heartbeat_config, rank_identity

    session = Session(rank_identity(), tmp_path, heartbeat_config(), publish=False)
    session.set_phase("train")
    seen: list[tuple[str, str | None]] = []

    class Held(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            deadline = time.monotonic() + 10
            while session.tracker.checkpoint_id != "wait:step_000000007":
                assert time.monotonic() < deadline, "the wait never entered its phase"
                time.sleep(0.01)
            seen.append((session.tracker.phase, session.tracker.checkpoint_id))
            return super().write_data(plan, planner)

    t = Trainer()
    m = manager(cfg(tmp_path, async_save=True), t, session=session, writer_factory=Held)
    m.save(7)
    assert session.tracker.phase == "train" and m.in_flight
    progress = session.tracker.progress_seq
    m.close()
    assert seen == [("checkpointing", "wait:step_000000007")]
    assert session.tracker.phase == "train" and not session.tracker.checkpoint_active
    assert session.tracker.progress_seq == progress  # the save's end only
    assert len(session.tracker.checkpoint_durations_ns) == 1
    assert session.tracker.phase_spans[-1][2] == "checkpointing"
    assert m.last_committed["persistent"] == 7


def test_status_file_and_the_status_screen(tmp_path: Path) -> None:
    from rankguard.cli.status_render import checkpoint_lines
    from rankguard.schema.statusblocks import CheckpointsBlock

    status = tmp_path / "run" / "checkpoints.json"
    config = cfg(
        tmp_path,
        async_save=True,
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(tmp_path / "local"),
    )
    t = Trainer()
    with manager(config, t, status_path=status) as m:
        m.save(3)
        m.save(4, tier="local")
    doc = json.loads(status.read_text())
    assert doc["last_committed"] == {"persistent": 3, "local": 4} and doc["inflight"] is None
    assert doc["last"]["persistent"]["stage_s"] >= 0 and doc["last"]["local"]["write_s"] > 0
    text = "\n".join(checkpoint_lines(CheckpointsBlock.from_dict(doc)))
    assert "persistent  last committed step 3  stage" in text
    assert "local       last committed step 4" in text
    doc["inflight"] = {"tier": "persistent", "step": 5, "since": "2026-01-01T00:00:00+00:00"}
    doc["failures"], doc["last_error"] = 1, "disk full"
    text = "\n".join(checkpoint_lines(CheckpointsBlock.from_dict(doc)))
    assert "in flight   step 5 (persistent) since 2026-01-01 00:00:00Z" in text
    assert "FAILED saves: 1; last: disk full" in text


def test_an_async_save_holds_the_state_of_the_save_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The next forward changes the BatchNorm statistics and the next optimizer step the
    weights and moments while the write is in flight: the checkpoint has neither. The
    save is said as Megatron Bridge's verification looks for it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    config = cfg(tmp_path, async_save=True)
    m = CheckpointManager(config, {"model": model, "optim": opt}, job_id="j", session=False)

    def step() -> None:
        model(torch.randn(32, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    moments = opt.state[model[0].weight]["exp_avg"].clone()
    m.save(1)
    assert "Scheduling async checkpoint save at step 1 (persistent)" in capsys.readouterr().err
    step()  # forward changes the BatchNorm statistics, opt.step the weights
    assert not torch.equal(model[1].running_mean, expected["1.running_mean"])
    m.close()
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    with CheckpointManager(
        config, {"model": fresh, "optim": fresh_opt}, job_id="j", session=False
    ) as m2:
        assert m2.load_latest() == 1
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert torch.equal(fresh_opt.state[fresh[0].weight]["exp_avg"], moments)


def test_a_corrupt_local_shard_falls_back_to_the_previous_local_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cfg(
        tmp_path,
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(tmp_path / "local"),
        non_persistent_save_interval=1,
    )
    t = Trainer()
    with manager(config, t) as m:
        t.step()
        m.maybe_save(1)
        first = weights(t)
        t.step()
        m.maybe_save(2)
    shard = tmp_path / "local" / "step_000000002" / "shard_0_on_0" / "shard.pt"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    t2 = Trainer(seed=8)
    with manager(config, t2) as m:
        assert m.load_latest() == 1
    assert same(weights(t2), first)
    err = capsys.readouterr().err
    assert "local checkpoint step 2 unusable, falling back" in err and "corrupt" in err
