"""The rerun section of the root config: names, aliases, errors, warnings."""

from __future__ import annotations

import pytest

from rankguard.config import ConfigError, load_config


def test_rerun_section_in_the_root_config() -> None:
    cfg = load_config(None, ["rerun_state_machine.rerun_mode=report_stats"])
    assert cfg.rerun_state_machine.rerun_mode == "report_determinism_stats"
    assert cfg.rerun_state_machine.enabled
    assert not load_config(None, []).rerun_state_machine.enabled


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("rerun_state_machine.rerun_mode=always", r"rerun_state_machine\.rerun_mode"),
        ("rerun_state_machine.spiky_loss_factor=0.5", r"rerun_state_machine\.spiky_loss_factor"),
        ("rerun_state_machine.check_for_nans=true", r"rerun_state_machine\.check_for_nans"),
    ],
)
def test_bad_rerun_settings_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_rerun_warnings() -> None:
    injecting = load_config(None, ["rerun_state_machine.error_injection_rate=10"])
    assert any("nothing is injected" in w for w in injecting.warnings())
    quiet = load_config(
        None,
        [
            "rerun_state_machine.rerun_mode=validate_results",
            "heartbeat.enabled=false",
        ],
    )
    assert any("rerun_state_machine is on but heartbeat" in w for w in quiet.warnings())
