"""``live_state(checkpoint=...)``'s pure parts: where a newcomer's sharded state came
from as ``restarts.jsonl`` says it, the declaration's checks, and a sharded job that
never asks the launcher to shrink."""

from __future__ import annotations

import pytest

from rankguard.checkpoint.tiers import Candidate
from rankguard.live.keys import LiveKeys
from rankguard.live.link import LiveLink
from rankguard.live.plan import Resumed
from rankguard.live.sharded import source_of
from rankguard.live.state import live_state
from tests.factories import DictStore


def test_the_source_names_the_replica_the_own_directory_or_the_checkpoint() -> None:
    local = Candidate(5, "local", {0: 0, 1: 1, 2: 3, 3: 3})
    assert source_of(local, 2) == "local checkpoint step 5: replica on rank 3"
    assert source_of(local, 1) == "local checkpoint step 5: rank 1's own local directory"
    assert source_of(Candidate(3, "persistent", "step_3"), 2) == "checkpoint step 3 (persistent)"


def test_the_resumed_record_carries_its_source_and_reads_an_older_one() -> None:
    got = Resumed(t=3.0, step=6, steps_redone=1, source="checkpoint step 3 (persistent)")
    assert Resumed.from_json(got.to_json()) == got
    assert Resumed.from_json('{"t": 3.0, "step": 6, "steps_redone": 0}').source is None


def test_the_declaration_is_either_replicated_or_through_the_manager() -> None:
    with pytest.raises(ValueError, match="leave model= and optimizer= out"):
        live_state(model=object(), checkpoint=object(), step=1)
    with pytest.raises(ValueError, match=r"model= .* or checkpoint="):
        live_state(step=1)
    assert live_state(checkpoint=object(), step=4) == 4  # outside a wrapped call


def test_a_sharded_job_does_not_ask_the_launcher_to_shrink(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link = LiveLink(LiveKeys("t", 0), standby=False)
    link.store = DictStore()
    link.shrink = True
    link.declare(sharded=True)
    assert link.store.check([link.keys.declared])
    assert not link.store.check([link.keys.shrink])
    assert "shrink_when_no_standby has no effect for sharded state" in caplog.text
    replicated = LiveLink(LiveKeys("t", 0), standby=False)
    replicated.store = DictStore()
    replicated.shrink = True
    replicated.declare()
    assert replicated.store.check([replicated.keys.shrink])
