"""Learned timeouts: measured maxima over ranks, safety factor, floor, EMA, state file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankguard.config import RankguardConfig, load_config
from rankguard.ft.learned import (
    MIN_STEPS,
    STATE_FILE,
    learn,
    learned_config,
    load_state,
    measured_maxima,
    save_state,
)
from rankguard.launcher.services import node_cadence
from rankguard.schema.records import HeartbeatRecord, RecordError

LEARNED = "learned (ft_state.json, 2 run(s))"


def maxima(raws: list[dict[str, Any]]) -> dict[str, float]:
    """``measured_maxima`` over the records the monitor accepts (it rejects a record
    whose ``ft_stats`` is not an object)."""
    records = []
    for raw in raws:
        try:
            records.append(HeartbeatRecord.from_dict({"run_id": "r", "rank": 0, "pid": 10, **raw}))
        except RecordError:
            continue
    return measured_maxima(records)


def stats(
    *,
    setup_s: float | None = 2.0,
    step_max_s: float = 0.5,
    steps: int = MIN_STEPS,
    ckpt_max_s: float = 0.0,
    ckpts: int = 0,
    hb_gap_max_s: float = 5.1,
) -> dict[str, Any]:
    return {
        "event": "heartbeat",
        "ft_stats": {
            "setup_s": setup_s,
            "step_max_s": step_max_s,
            "steps": steps,
            "ckpt_max_s": ckpt_max_s,
            "ckpts": ckpts,
            "hb_gap_max_s": hb_gap_max_s,
        },
    }


# ---- measured_maxima -----------------------------------------------------------------


def test_measured_maxima_is_the_max_over_ranks() -> None:
    records = [
        stats(setup_s=2.0, step_max_s=0.5, ckpt_max_s=3.0, ckpts=1, hb_gap_max_s=5.3),
        stats(setup_s=3.5, step_max_s=0.7, ckpt_max_s=2.0, ckpts=2, hb_gap_max_s=5.1),
        stats(setup_s=1.0, step_max_s=0.6, ckpt_max_s=0.0, ckpts=0, hb_gap_max_s=5.2),
    ]
    assert maxima(records) == {
        "setup": 3.5,
        "step": 0.7,
        "checkpointing": 3.0,
        "heartbeat": 5.3,
    }


def test_step_only_after_min_steps() -> None:
    assert MIN_STEPS == 16
    few = maxima([stats(steps=MIN_STEPS - 1, step_max_s=9.0)])
    assert "step" not in few
    assert few["setup"] == 2.0  # the other sections are still measured
    enough = maxima([stats(steps=MIN_STEPS, step_max_s=9.0)])
    assert enough["step"] == 9.0
    # A rank with too few steps does not contribute, even with the longest one.
    mixed = maxima([stats(steps=MIN_STEPS - 1, step_max_s=50.0), stats(steps=100, step_max_s=1.0)])
    assert mixed["step"] == 1.0


def test_checkpointing_only_after_a_real_save() -> None:
    assert "checkpointing" not in maxima([stats(ckpt_max_s=7.0, ckpts=0)])
    assert maxima([stats(ckpt_max_s=7.0, ckpts=1)])["checkpointing"] == 7.0


def test_zero_and_missing_values_are_not_measurements() -> None:
    out = maxima([stats(setup_s=None, step_max_s=0.0, hb_gap_max_s=0.0)])
    assert out == {}


def test_missing_or_garbage_ft_stats_are_ignored() -> None:
    records: list[dict[str, Any]] = [
        {"event": "heartbeat"},
        {"event": "heartbeat", "ft_stats": None},
        {"event": "heartbeat", "ft_stats": "garbage"},
        {"event": "heartbeat", "ft_stats": [1, 2, 3]},
        {"event": "heartbeat", "ft_stats": 42},
        stats(setup_s=4.0, hb_gap_max_s=6.0),
    ]
    assert maxima(records) == {"setup": 4.0, "step": 0.5, "heartbeat": 6.0}
    assert maxima(records[:5]) == {}
    assert maxima([]) == {}


def test_non_numeric_values_inside_ft_stats_are_ignored() -> None:
    rec = stats()
    rec["ft_stats"].update({"setup_s": "slow", "hb_gap_max_s": [1.0], "step_max_s": None})
    assert maxima([rec]) == {}


def test_non_numeric_counts_inside_ft_stats_are_ignored() -> None:
    rec = stats(setup_s=4.0)
    rec["ft_stats"]["steps"] = "many"
    rec["ft_stats"]["ckpts"] = "one"
    out = maxima([rec])
    assert out == {"setup": 4.0, "heartbeat": 5.1}


# ---- learn ---------------------------------------------------------------------------


def test_learn_is_max_times_safety_factor() -> None:
    state = learn({"step": 20.0, "setup": 100.0}, None, safety_factor=5.0, floor_s=60.0)
    assert state["timeouts"] == {"step": 100.0, "setup": 500.0}
    assert state["last_measured_max_s"] == {"step": 20.0, "setup": 100.0}
    assert state["runs"] == 1
    assert state["safety_factor"] == 5.0
    assert state["min_learned_timeout_s"] == 60.0
    assert state["schema_version"] == 1


def test_learn_floors_a_tiny_measurement() -> None:
    # 4 ms x 5 = 20 ms would kill the next slow start; the floor is what is learned.
    state = learn({"step": 0.004}, None, safety_factor=5.0, floor_s=60.0)
    assert state["timeouts"]["step"] == 60.0
    assert state["last_measured_max_s"]["step"] == 0.004


def test_learn_merges_with_previous_value_by_ema() -> None:
    previous = {"timeouts": {"step": 300.0, "setup": 900.0}, "runs": 2}
    state = learn({"step": 20.0}, previous, safety_factor=5.0, floor_s=60.0)
    assert state["timeouts"]["step"] == pytest.approx(0.5 * 300.0 + 0.5 * 100.0)
    assert state["timeouts"]["setup"] == 900.0  # not re-measured: kept
    assert state["runs"] == 3
    # The EMA uses the floored new value, and the result is floored again.
    state = learn({"step": 0.001}, {"timeouts": {"step": 61.0}}, safety_factor=5.0, floor_s=60.0)
    assert state["timeouts"]["step"] == pytest.approx(60.5)
    state = learn({"step": 0.001}, {"timeouts": {"step": 10.0}}, safety_factor=5.0, floor_s=60.0)
    assert state["timeouts"]["step"] == 60.0


def test_learn_converges_over_runs() -> None:
    state: dict[str, Any] | None = None
    for _ in range(12):
        state = learn({"step": 40.0}, state, safety_factor=5.0, floor_s=60.0)
    assert state is not None
    assert state["runs"] == 12
    assert state["timeouts"]["step"] == pytest.approx(200.0)


def test_learn_runs_counter_without_a_previous_count() -> None:
    for previous in ({"timeouts": {}}, {"timeouts": {}, "runs": None}):
        assert learn({"heartbeat": 12.0}, previous, safety_factor=5, floor_s=60)["runs"] == 1


# ---- state file ----------------------------------------------------------------------


def test_load_state_missing_is_none(tmp_path: Path) -> None:
    assert load_state(tmp_path / STATE_FILE) is None
    assert load_state(tmp_path / "no" / "such" / STATE_FILE) is None


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '"text"', "{}", '{"timeouts": [60]}', '{"timeouts": null}', ""],
)
def test_load_state_malformed_names_the_path(tmp_path: Path, text: str) -> None:
    path = tmp_path / STATE_FILE
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_state(path)
    assert str(path) in str(info.value)
    assert "ft_state.json" in str(info.value)


def test_save_load_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "ft" / STATE_FILE  # directories are created
    state = learn({"step": 20.0, "heartbeat": 5.2}, None, safety_factor=5.0, floor_s=60.0)
    save_state(path, state)
    assert load_state(path) == state
    assert [p.name for p in path.parent.iterdir()] == [STATE_FILE]  # no temp file left
    second = learn({"step": 30.0}, load_state(path), safety_factor=5.0, floor_s=60.0)
    save_state(path, second)
    assert load_state(path) == second
    assert load_state(path)["runs"] == 2  # type: ignore[index]
    assert [p.name for p in path.parent.iterdir()] == [STATE_FILE]
    assert json.loads(path.read_text(encoding="utf-8"))["timeouts"]["step"] == 125.0


# ---- learned_config ------------------------------------------------------------------


def _in_force(cfg: RankguardConfig, sources: dict[str, str]) -> dict[str, Any]:
    return node_cadence(cfg, sources).in_force()


def test_learned_config_sets_sections_and_process_timeout() -> None:
    cfg = load_config(
        overrides=["fault_tolerance.rank_section_timeouts=setup:600,eval:50,step:180"]
    )
    state = {"timeouts": {"step": 100.0, "checkpointing": 420.0, "heartbeat": 45.0}}
    new, sources = learned_config(cfg, state, LEARNED)
    assert new.fault_tolerance.rank_section_timeouts == {
        "setup": 600.0,
        "eval": 50.0,
        "step": 100.0,
        "checkpointing": 420.0,
    }
    assert new.heartbeat.process_timeout_s == 45.0
    # a new config: the validated one is left as it was
    assert cfg.fault_tolerance.rank_section_timeouts == {
        "setup": 600.0,
        "eval": 50.0,
        "step": 180.0,
    }
    assert cfg.heartbeat.process_timeout_s == 30.0
    shown = _in_force(new, sources)
    assert shown["phase.step"] == {"value": 100.0, "source": LEARNED}
    assert shown["phase.checkpointing"] == {"value": 420.0, "source": LEARNED}
    section = "config (fault_tolerance.rank_section_timeouts.{})"
    assert shown["phase.setup"] == {"value": 600.0, "source": section.format("setup")}
    assert shown["phase.eval"] == {"value": 50.0, "source": section.format("eval")}
    assert shown["process"] == {"value": 45.0, "source": LEARNED}
    assert shown["initial_process"] == {
        "value": 30.0,
        "source": "config (heartbeat.initial_process_timeout_s)",
    }
    # a phase without its own timeout: the progress timeout
    assert shown["phase.other"] == {
        "value": 300.0,
        "source": "config (heartbeat.progress_timeout_s)",
    }
    assert shown["phase.inprocess_restart"]["source"] == "config (inprocess_restart.hard_timeout)"
    assert set(shown) == {
        "initial_process",
        "process",
        "phase.setup",
        "phase.step",
        "phase.checkpointing",
        "phase.eval",
        "phase.inprocess_restart",
        "phase.closing",
        "phase.other",
    }


def test_learned_config_without_state_is_all_config() -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_section_timeouts=step:180"])
    new, sources = learned_config(cfg, None, LEARNED)
    assert sources == {}
    assert new.fault_tolerance.rank_section_timeouts == {"step": 180.0}
    assert new.heartbeat.process_timeout_s == 30.0
    shown = _in_force(new, sources)
    assert all(entry["source"].startswith("config (") for entry in shown.values())
    assert shown["phase.step"] == {
        "value": 180.0,
        "source": "config (fault_tolerance.rank_section_timeouts.step)",
    }
    assert shown["process"]["value"] == 30.0
    assert shown["phase.eval"]["value"] == 1800.0
    assert shown["phase.setup"]["value"] == 600.0
    assert shown["phase.checkpointing"]["value"] == 1800.0
    assert shown["phase.closing"]["value"] == 1800.0
    assert len(shown) == 9  # two process timeouts, six phases and the other phases


def test_learned_heartbeat_never_below_two_publish_intervals() -> None:
    cfg = RankguardConfig()  # publish_interval_s 5
    new, _ = learned_config(cfg, {"timeouts": {"heartbeat": 6.0}}, LEARNED)
    assert new.heartbeat.process_timeout_s == 10.0
