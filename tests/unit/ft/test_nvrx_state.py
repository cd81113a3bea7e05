"""NVRx's ft_state.json (the client's state_dict, as Megatron-LM keeps it in
<save>/ft_state.json): read as learned timeouts, kept in NVRx's layout when written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.config import RankguardConfig
from rankguard.ft.config import FaultToleranceConfig
from rankguard.ft.learned import learned_config, load_state, save_learned
from rankguard.ft.nvrx_state import RANKGUARD_STATE_FILE, from_nvrx, is_nvrx_state, to_nvrx
from rankguard.launcher.services import node_cadence
from rankguard.schema.records import HeartbeatRecord

nvrx_data = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.data")


def _client_state(calculated: tuple[str, ...] = ("step",), oos: bool = False) -> dict[str, Any]:
    """What RankMonitorClient.state_dict() returns (its own dataclasses, asdict)."""
    section = nvrx_data.SectionTimeouts(
        section={"setup": 600.0, "step": 42.0, "checkpointing": 420.0},
        out_of_section=77.0,
        calculated_sections=set(calculated),
        is_out_of_section_calculated=oos,
    )
    hb = nvrx_data.HeartbeatTimeouts(initial=900.0, subsequent=120.0, were_calculated=True)
    sec = dataclasses.asdict(section)
    sec["calculated_sections"] = sorted(sec["calculated_sections"])
    return {"current_timeouts": {"section": sec, "heartbeat": dataclasses.asdict(hb)}}


def test_only_calculated_values_are_learned() -> None:
    state = _client_state(("step",), oos=True)
    assert is_nvrx_state(state)
    got = from_nvrx(state)
    assert got["timeouts"] == {
        "step": 42.0,
        "out_of_section": 77.0,
        "heartbeat": 120.0,
        "initial_heartbeat": 900.0,
    }


def test_load_state_reads_nvrx_layout_and_applies_it(tmp_path: Path) -> None:
    path = tmp_path / "ft_state.json"
    path.write_text(json.dumps(_client_state(("step", "checkpointing"), oos=True)))
    state = load_state(path)
    assert state is not None
    cfg = RankguardConfig()
    assert cfg.heartbeat.publish_interval_s == 5
    cfg, sources = learned_config(cfg, state, "learned")
    shown = node_cadence(cfg, sources).in_force()
    assert cfg.fault_tolerance.rank_section_timeouts == {"step": 42.0, "checkpointing": 420.0}
    assert cfg.fault_tolerance.rank_out_of_section_timeout == 77.0
    assert cfg.heartbeat.process_timeout_s == 120.0
    assert cfg.heartbeat.initial_process_timeout_s == 900.0
    assert shown["phase.step"]["source"] == "learned"


def test_broken_nvrx_layout_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ft_state.json"
    path.write_text(json.dumps({"current_timeouts": {"section": {"section": 3}}}))
    with pytest.raises(ValueError, match="NVRx"):
        load_state(path)


def test_saving_keeps_nvrx_layout_and_writes_rankguard_state_beside(tmp_path: Path) -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    path = tmp_path / "ft_state.json"
    path.write_text(json.dumps(_client_state(("step",))))
    stats = {
        "setup_s": 30.0,
        "steps": 20,
        "step_max_s": 2.0,
        "ckpts": 1,
        "ckpt_max_s": 40.0,
        "hb_gap_max_s": 6.0,
    }
    records = [
        HeartbeatRecord.from_dict(
            {"event": "heartbeat", "run_id": "r", "rank": r, "pid": 10 + r, "ft_stats": stats}
        )
        for r in range(2)
    ]
    ft = FaultToleranceConfig(calc_ft_timeouts=True)
    state = save_learned(tmp_path, ft, records)
    assert state is not None
    own = json.loads((tmp_path / RANKGUARD_STATE_FILE).read_text())
    assert own["timeouts"]["checkpointing"] == 200.0  # 40 s x 5
    written = json.loads(path.read_text())
    assert is_nvrx_state(written)
    # NVRx's own client reads what was written
    client = RankMonitorClient()
    client.load_state_dict(written)
    loaded = client.loaded_section_timeouts
    assert loaded.section["checkpointing"] == 200.0
    assert {"step", "setup", "checkpointing"} <= set(loaded.calculated_sections)
    assert loaded.out_of_section == 77.0 and loaded.is_out_of_section_calculated is False
    # the next launch reads rankguard's own state (runs, EMA) first
    again = load_state(path)
    assert again is not None and again["runs"] == own["runs"] == 1


def test_rankguard_state_is_never_under_nvrx_file_name(tmp_path: Path) -> None:
    """Without NVRx's file, rankguard's own state goes to its own name: ft_state.json is
    the name NVRx's client (and Megatron Bridge) read as theirs."""
    stats = {"setup_s": 30.0, "steps": 20, "step_max_s": 2.0, "hb_gap_max_s": 6.0}
    records = [
        HeartbeatRecord.from_dict(
            {"event": "heartbeat", "run_id": "r", "rank": 0, "pid": 10, "ft_stats": stats}
        )
    ]
    ft = FaultToleranceConfig(calc_ft_timeouts=True)
    assert save_learned(tmp_path, ft, records) is not None
    assert [p.name for p in tmp_path.iterdir()] == [RANKGUARD_STATE_FILE]
    again = load_state(tmp_path / "ft_state.json")  # the next launch finds it
    assert again is not None and again["runs"] == 1
    assert save_learned(tmp_path, ft, records) is not None
    assert [p.name for p in tmp_path.iterdir()] == [RANKGUARD_STATE_FILE]
    assert json.loads((tmp_path / RANKGUARD_STATE_FILE).read_text())["runs"] == 2


def test_bridge_config_keeps_ft_state_beside_checkpoint_save() -> None:
    from rankguard.config import load_config

    fixtures = Path(__file__).parent.parent.parent / "fixtures"
    cfg = load_config(fixtures / "megatron_bridge_config.yaml")
    assert cfg.fault_tolerance.state_dir == cfg.checkpoint.save == "/ckpt/run1"
    cfg = load_config(
        fixtures / "megatron_bridge_config.yaml", ["fault_tolerance.state_dir=/elsewhere"]
    )
    assert cfg.fault_tolerance.state_dir == "/elsewhere"  # set, it stays
    assert load_config(None, ["checkpoint.save=/c"]).fault_tolerance.state_dir is None


def test_to_nvrx_leaves_a_plain_copy() -> None:
    prev = _client_state(("step",))
    out = to_nvrx(prev, {"step": 10.0, "heartbeat": 5.0})
    assert prev["current_timeouts"]["section"]["section"]["step"] == 42.0  # untouched
    assert out["current_timeouts"]["section"]["section"]["step"] == 10.0
    assert out["current_timeouts"]["heartbeat"] == prev["current_timeouts"]["heartbeat"]


def test_the_launch_names_the_file_it_learned_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankguard.config import load_config
    from rankguard.launcher.run import _timeouts_in_force

    cfg = load_config(
        None, ["fault_tolerance.calc_ft_timeouts=true", f"fault_tolerance.state_dir={tmp_path}"]
    )
    _timeouts_in_force(cfg)
    assert f"no learned timeouts in {tmp_path} yet" in capsys.readouterr().err
    state = {"schema_version": 1, "runs": 2, "timeouts": {"step": 90.0}}
    (tmp_path / RANKGUARD_STATE_FILE).write_text(json.dumps(state))
    (tmp_path / "ft_state.json").write_text(json.dumps(_client_state(("step",))))
    shown = _timeouts_in_force(cfg)
    assert shown is not None
    err = capsys.readouterr().err
    assert f"learned ({tmp_path / RANKGUARD_STATE_FILE}, 2 run(s))" in err, err
