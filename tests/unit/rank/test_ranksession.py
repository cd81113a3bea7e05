"""Session and NullSession both satisfy RankSession: at run time, member by member, and
for mypy (the assignments below, and the check in ``rankguard.session``)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from rankguard.rank.ranksession import RankSession
from rankguard.schema.blocks import InProcessBlock
from rankguard.session import NullSession, Session
from tests.factories import heartbeat_config, rank_identity

MEMBERS = sorted(
    name
    for name in dir(RankSession)
    if not name.startswith("_") and name not in dir(object) and name != "mro"
)


def _session(tmp_path: Path) -> Session:
    return Session(rank_identity(), tmp_path, heartbeat_config(), publish=False)


def test_both_sessions_are_rank_sessions(tmp_path: Path) -> None:
    real: RankSession = _session(tmp_path)  # mypy checks these assignments
    null: RankSession = NullSession()
    try:
        assert isinstance(real, RankSession) and isinstance(null, RankSession)
        assert real.enabled and not null.enabled
    finally:
        real.close()
    assert not isinstance(object(), RankSession)


@pytest.mark.parametrize("name", MEMBERS)
def test_every_member_has_the_protocols_signature(name: str, tmp_path: Path) -> None:
    want = inspect.getattr_static(RankSession, name)
    real = _session(tmp_path)
    try:
        for session in (real, NullSession()):
            assert hasattr(session, name), (type(session).__name__, name)
            if isinstance(want, property):  # an attribute or a property is enough
                continue
            have = getattr(session, name)
            assert callable(have), (type(session).__name__, name)
            params = inspect.signature(have).parameters
            open_kw = any(q.kind is q.VAR_KEYWORD for q in params.values())
            for p in inspect.signature(want).parameters.values():
                if p.name == "self" or p.kind is p.VAR_KEYWORD:
                    continue
                assert p.name in params or open_kw, f"{type(session).__name__}.{name}: {p.name}"
    finally:
        real.close()


def test_the_null_session_does_nothing_with_a_block() -> None:
    null = NullSession()
    null.add_heartbeat_block(lambda: InProcessBlock(restarts=1))
    null.mark_recovered()
    assert null.current_phase is None and null.perf is None


def test_the_session_reports_its_phase_and_recovery(tmp_path: Path) -> None:
    s = _session(tmp_path)
    try:
        s.set_phase("eval")
        assert s.current_phase == "eval"
        s.mark_recovered()
        assert s.tracker.phase == "eval"
    finally:
        s.close()
