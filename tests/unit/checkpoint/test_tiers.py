"""The manager reaches both checkpoint tiers through one interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rankguard.checkpoint import CheckpointConfig, CheckpointManager
from rankguard.checkpoint.tiers import BoundTier, Candidate, CheckpointTier


def test_a_bound_tier_is_a_tier_and_passes_calls_through() -> None:
    calls: list[Any] = []
    tier = BoundTier(
        "local",
        lambda step, blocking, t0: lambda: calls.append(("job", step, blocking, t0)),
        lambda: [(7, "where-7"), (5, "where-5")],
        lambda step, where: calls.append(("load", step, where)) or step == 5,
    )
    assert isinstance(tier, CheckpointTier)
    tier.start_save(3, True, 1.5)()
    assert tier.candidates() == [Candidate(7, "local", "where-7"), Candidate(5, "local", "where-5")]
    assert not tier.load(Candidate(7, "local", "where-7"))
    assert tier.load(Candidate(5, "local", "where-5"))
    assert calls == [("job", 3, True, 1.5), ("load", 7, "where-7"), ("load", 5, "where-5")]


def test_the_manager_saves_and_loads_through_its_tiers(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    config = CheckpointConfig(
        save=str(tmp_path / "ckpt"),
        non_persistent_ckpt_type="local",
        non_persistent_local_ckpt_dir=str(tmp_path / "local"),
        async_save=False,
    )
    with CheckpointManager(config, {"model": model}, job_id="j", session=False) as m:
        assert list(m.tiers) == ["local", "persistent"]
        assert all(isinstance(t, CheckpointTier) and t.name == k for k, t in m.tiers.items())
        m.save(1, tier="persistent")
        m.save(2, tier="local")
        m.save(2, tier="persistent")
        steps = [(c.step, c.tier) for c in m._candidates()]
        # newest first; at one step the local copy before the shared one
        assert steps == [(2, "local"), (2, "persistent"), (1, "persistent")]
        saved = model.weight.detach().clone()
        with torch.no_grad():
            model.weight.zero_()
        assert m.load_latest() == 2 and m.record.loaded is not None
        assert m.record.loaded.tier == "local"
        assert torch.equal(model.weight, saved)


def test_each_tier_is_its_own_class_behind_the_interface(tmp_path: Path) -> None:
    from rankguard.checkpoint.localtier import LocalTier
    from rankguard.checkpoint.persistent import PersistentTier

    config = CheckpointConfig(save=str(tmp_path / "ckpt"), async_save=False)
    with CheckpointManager(
        config, {"model": torch.nn.Linear(2, 2)}, job_id="j", session=False
    ) as m:
        assert isinstance(m.tiers["persistent"], PersistentTier)
        assert isinstance(m.tiers["local"], LocalTier)
        # the local tier is off here: no store, no candidates; the manager says so too
        assert m.local is None and m.tiers["local"].candidates() == []
        m.save(3)
        # loads come from checkpoint.save when checkpoint.load is not set
        assert [(c.step, c.tier) for c in m._candidates()] == [(3, "persistent")]
