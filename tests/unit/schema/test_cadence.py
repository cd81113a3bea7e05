"""The cadence: every delay derived from the heartbeat and scan intervals, each by its
formula, and the timeouts in force phase by phase, with where each came from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rankguard.cli.status_render import render_status
from rankguard.config import RankguardConfig, build, load_config
from rankguard.launcher.services import NodeServices, node_cadence
from rankguard.monitor.config import HeartbeatConfig
from rankguard.schema.cadence import Cadence
from rankguard.schema.layout import STATUS_FILE

P, S = 3.0, 0.5  # publish and scan intervals


def _cadence(**sections: float) -> Cadence:
    hb = HeartbeatConfig(publish_interval_s=P, scan_interval_s=S)
    return Cadence.of(hb, sections=sections)


def test_each_delay_is_its_formula() -> None:
    c = _cadence()
    assert c.fresh_s == 2 * P + S
    assert c.stop_lead_s == 2 * P + 2 * S + 1
    assert c.fresh_lead_s == 2 * S + 1
    assert c.fresh_wait_s == P + S + 1
    assert c.agreement_lead_s(relayed=True) == (P + S + 1) + (2 * P + 2 * S + 1)
    assert c.agreement_lead_s(relayed=False) == S + (2 * S + 1)
    assert c.learned_floor_s == 2 * P
    assert c.drain_s(relayed=False) == 2 * P + S
    assert c.drain_s(relayed=True) == 2 * P + S + 2 * P


def test_the_drain_is_at_least_five_seconds() -> None:
    c = Cadence.of(HeartbeatConfig(publish_interval_s=0.5, scan_interval_s=0.2))
    assert c.drain_s(relayed=False) == 5.0
    assert c.drain_s(relayed=True) == 5.0


@pytest.mark.parametrize(
    ("sections", "setup", "step", "checkpointing"),
    [
        ({}, 600.0, 300.0, 1800.0),
        ({"step": 120.0}, 600.0, 120.0, 1800.0),
        ({"setup": 90.0, "checkpointing": 400.0}, 90.0, 300.0, 400.0),
    ],
)
def test_a_section_replaces_the_progress_timeout_of_its_phase(
    sections: dict[str, float], setup: float, step: float, checkpointing: float
) -> None:
    c = _cadence(**sections)
    assert (c.setup_timeout_s, c.step_timeout_s, c.checkpointing_timeout_s) == (
        setup,
        step,
        checkpointing,
    )
    assert c.shortest_progress_timeout_s == min(300.0, 600.0, 1800.0, *sections.values())


def test_timeouts_in_force_name_the_step_section_and_its_source() -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_section_timeouts=step:120"])
    shown = node_cadence(cfg).in_force()
    assert shown["phase.step"] == {
        "value": 120.0,
        "source": "config (fault_tolerance.rank_section_timeouts.step)",
    }
    # without a section, the heartbeat key is in force and named
    plain = node_cadence(RankguardConfig()).in_force()
    assert plain["phase.step"] == {
        "value": 300.0,
        "source": "config (heartbeat.progress_timeout_s)",
    }


def test_nvrx_names_and_learned_timeouts_say_where_they_came_from() -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_heartbeat_timeout=90"])
    shown = node_cadence(cfg).in_force()
    assert shown["process"] == {
        "value": 90.0,
        "source": "config (fault_tolerance.rank_heartbeat_timeout)",
    }
    learned = node_cadence(cfg, {"heartbeat.process_timeout_s": "learned (x, 1 run(s))"})
    assert learned.in_force()["process"]["source"] == "learned (x, 1 run(s))"


def test_out_of_section_timeout_is_eval_and_the_other_phases(tmp_path: Path) -> None:
    cfg = load_config(overrides=["fault_tolerance.rank_out_of_section_timeout=70"])
    shown = node_cadence(cfg).in_force()
    source = "config (fault_tolerance.rank_out_of_section_timeout)"
    assert shown["phase.eval"] == {"value": 70.0, "source": source}
    assert shown["phase.other"] == {"value": 70.0, "source": source}
    assert shown["phase.closing"] == {"value": 70.0, "source": source}


def test_the_closing_phase_has_its_line_as_the_rules_judge_it() -> None:
    # the session's close after the script returned: the checkpoint timeout, unless a
    # section of its own or the out-of-section timeout is in force (HeartbeatRules)
    plain = node_cadence(RankguardConfig()).in_force()
    assert plain["phase.closing"] == {
        "value": 1800.0,
        "source": "config (heartbeat.checkpoint_timeout_s)",
    }
    cfg = load_config(overrides=["fault_tolerance.rank_section_timeouts=closing:90"])
    assert node_cadence(cfg).in_force()["phase.closing"] == {
        "value": 90.0,
        "source": "config (fault_tolerance.rank_section_timeouts.closing)",
    }


def test_status_shows_the_step_section_under_timeouts_in_force(tmp_path: Path) -> None:
    cfg = build(
        RankguardConfig,
        {
            "heartbeat": {"enabled": True, "scan_interval_s": 0.1, "publish_interval_s": 0.5},
            "fault_tolerance": {"rank_section_timeouts": {"step": 45}},
        },
    )
    services = NodeServices(
        cfg=cfg,
        run_dir=tmp_path,
        run_id="run-cadence",
        node_rank=0,
        nnodes=1,
        expected_world_size=1,
    )
    services.start()
    monitor = services.monitor
    assert monitor is not None
    try:
        deadline = time.monotonic() + 10.0
        while not (tmp_path / STATUS_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        monitor.stop(drain_timeout_s=0.0)
    status = json.loads((tmp_path / STATUS_FILE).read_text(encoding="utf-8"))
    text = render_status(status, [], color=False)
    lines = text.splitlines()
    start = lines.index("Timeouts in force")
    table = lines[start + 1 :]
    step = next(line for line in table if line.strip().startswith("phase.step "))
    assert "45" in step and "config (fault_tolerance.rank_section_timeouts.step)" in step
    other = next(line for line in table if line.strip().startswith("phase.other "))
    assert "300" in other and "config (heartbeat.progress_timeout_s)" in other
