"""Reaching the training thread: interrupting it, seeing it stuck, aborting NCCL (fake)."""

from __future__ import annotations

import importlib
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from rankguard.inprocess.interrupt import Interrupter, Liveness, RestartInterrupt
from rankguard.inprocess.wrapper import abort_communicators


def _fire_later(interrupter: Interrupter, delay: float) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), interrupter.fire("peer")))
    t.start()
    return t


def test_signal_interrupts_a_blocking_sleep_on_the_main_thread() -> None:
    assert threading.current_thread() is threading.main_thread()
    it = Interrupter()
    it.install()
    try:
        it.armed = True
        t0 = time.monotonic()
        firing = _fire_later(it, 0.2)
        with pytest.raises(RestartInterrupt, match="peer"):
            time.sleep(30)
        assert time.monotonic() - t0 < 5
        assert not it.armed  # one delivery, one raise
        firing.join()
        it.fire("again")  # disarmed: nothing is raised
        time.sleep(0.1)
    finally:
        it.uninstall()


def test_an_unarmed_interrupter_raises_nothing() -> None:
    it = Interrupter()
    it.install()
    try:
        firing = _fire_later(it, 0.05)
        time.sleep(0.3)
        firing.join()
        assert it.deliveries == 0
    finally:
        it.uninstall()


def _armed_thread(seen: list[str], first: Any = None) -> tuple[threading.Thread, Interrupter]:
    """A thread armed with its own interrupter: runs ``first`` (if any; ``"done"`` noted
    after it), then Python code for up to 10 s; an interrupt is noted ``"interrupted"``."""
    holder: list[Interrupter] = []

    def body() -> None:
        it = Interrupter()
        it.armed = True
        holder.append(it)
        try:
            if first is not None:
                first()
                seen.append("done")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # Python code: the async exception lands
                time.sleep(0.01)
        except RestartInterrupt:
            seen.append("interrupted")

    t = threading.Thread(target=body)
    t.start()
    while not holder:
        time.sleep(0.001)
    return t, holder[0]


def test_another_thread_gets_an_async_exception() -> None:
    seen: list[str] = []
    t, it = _armed_thread(seen)
    it.fire("peer")
    t.join(timeout=10)
    assert seen == ["interrupted"]


def test_an_interrupt_inside_an_atomic_section_is_raised_as_it_ends() -> None:
    it = Interrupter()
    it.install()
    done: list[str] = []
    try:
        it.arm()
        firing = _fire_later(it, 0.05)
        with pytest.raises(RestartInterrupt, match="peer"):
            with it:
                with it:  # reentrant: the outer end raises
                    deadline = time.monotonic() + 0.5
                    while time.monotonic() < deadline:  # Python: the signal is handled here
                        time.sleep(0.01)
                    done.append("inner")
                done.append("outer")  # the section ran to its end
            done.append("after")  # never: the held interrupt is raised at the end
        firing.join()
        assert done == ["inner", "outer"]
        assert not it.armed and not it.pending and it.depth == 0
    finally:
        it.uninstall()


def test_outside_atomic_sections_the_interrupt_is_immediate_and_arm_drops_a_held_one() -> None:
    it = Interrupter()
    it.install()
    try:
        it.arm()
        with it:
            pass
        firing = _fire_later(it, 0.05)
        with pytest.raises(RestartInterrupt):
            time.sleep(30)
        firing.join()
        it.pending = True  # a held interrupt of the last round
        it.arm()
        with it:
            pass  # the new round's section ends without it
        assert it.armed
    finally:
        it.uninstall()


def test_an_exception_leaving_an_atomic_section_wins_over_the_held_interrupt() -> None:
    it = Interrupter()
    it.install()
    try:
        it.arm()
        firing = _fire_later(it, 0.02)
        with pytest.raises(ValueError, match="own"), it:
            time.sleep(0.3)
            time.sleep(0.01)  # the handler has run by now
            assert it.pending
            raise ValueError("own")
        firing.join()
        assert not it.pending and it.depth == 0
    finally:
        it.uninstall()


def test_atomic_holds_the_async_exception_of_another_thread() -> None:
    seen: list[str] = []
    holder: list[Interrupter] = []
    fired = threading.Event()

    def body() -> None:
        it = Interrupter()
        it.arm()
        try:
            with it:
                holder.append(it)
                fired.wait(10)
                for _ in range(1000):  # Python code: an async exception would land here
                    time.sleep(0)
                seen.append("section done")
        except RestartInterrupt:
            seen.append("interrupted")

    t = threading.Thread(target=body)
    t.start()
    while not holder:
        time.sleep(0.01)
    holder[0].fire("peer")
    fired.set()
    t.join(timeout=10)
    assert seen == ["section done", "interrupted"]


def test_atomic_outside_a_wrapped_call_is_a_no_op() -> None:
    from rankguard.inprocess import atomic

    with atomic(), atomic():
        pass


def test_liveness_stops_while_the_main_thread_is_blocked() -> None:
    live = Liveness()
    stop = threading.Event()
    idle: list[float] = []

    def ask() -> None:
        while not stop.is_set():
            live.ask()
            idle.append(live.idle_s())
            time.sleep(0.02)

    t = threading.Thread(target=ask)
    t.start()
    try:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            pass  # running Python: the callbacks run
        assert max(idle) < 0.2
        time.sleep(0.6)  # blocked in C: no callback runs until it returns
        assert max(idle) >= 0.5
    finally:
        stop.set()
        t.join()


class _FakeGroup:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def _fake_dist(group: Any, initialized: bool = True) -> Any:
    return SimpleNamespace(is_initialized=lambda: initialized, group=SimpleNamespace(WORLD=group))


def test_nccl_communicator_is_aborted_gloo_is_left_to_its_timeout() -> None:
    group = _FakeGroup()
    abort_communicators(_fake_dist(group), "nccl")
    assert group.aborted == 1
    abort_communicators(_fake_dist(group), "gloo")
    abort_communicators(_fake_dist(group, initialized=False), "nccl")
    assert group.aborted == 1


def test_session_carries_added_heartbeat_blocks(tmp_path: Any) -> None:
    from rankguard.schema.blocks import InProcessBlock
    from rankguard.session import Session
    from tests.factories import heartbeat_config, rank_identity

    session = Session(rank_identity(), tmp_path, heartbeat_config(), publish=True)
    try:
        session.add_heartbeat_block(lambda: InProcessBlock(restarts=2))
        assert session.publisher is not None
        session.publisher.wake()
        deadline = time.monotonic() + 5
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not seen:
            lines = session.publisher.path.read_text().splitlines()
            seen = [r for r in map(json.loads, lines) if "inprocess" in r]
            time.sleep(0.01)
    finally:
        session.close()
    assert seen and seen[0]["inprocess"] == {"restarts": 2, "recovering": False}


def test_session_publishes_a_heartbeat_on_demand_on_disk_when_it_returns(tmp_path: Any) -> None:
    from rankguard.schema.blocks import InProcessBlock
    from rankguard.session import NullSession, Session
    from tests.factories import heartbeat_config, rank_identity

    cfg = heartbeat_config(publish_interval_s=5.0)
    session = Session(rank_identity(), tmp_path, cfg, publish=True)
    try:
        restarts = [0]
        session.add_heartbeat_block(lambda: InProcessBlock(restarts=restarts[0]))
        assert session.publisher is not None
        restarts[0] = 1
        assert session.publish_heartbeat() is True  # the interval is 5 s
        lines = session.publisher.path.read_text().splitlines()
        seen = [r["inprocess"]["restarts"] for r in map(json.loads, lines) if "inprocess" in r]
    finally:
        session.close()
    assert seen[-1] == 1
    assert NullSession().publish_heartbeat() is False


def _slow_module(tmp_path: Any, name: str, seconds: float) -> None:
    """A module whose top-level code takes ``seconds`` (as a lazy ``torch._dynamo``
    import does), then sets ``DONE``."""
    (tmp_path / f"{name}.py").write_text(
        f"import time\nSTARTED = True\ntime.sleep({seconds})\nDONE = True\n"
    )


def test_an_interrupt_during_an_import_is_raised_after_it_not_inside_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    _slow_module(tmp_path, "rg_slow_import_main", 0.6)
    it = Interrupter()
    it.install()
    try:
        it.armed = True
        firing = _fire_later(it, 0.2)  # lands inside the module's top-level sleep
        import rg_slow_import_main  # type: ignore[import-not-found]  # noqa: F401

        firing.join()
        module = sys.modules["rg_slow_import_main"]
        assert module.DONE  # the import finished whole
        assert it.held_in_import == 1 and it.armed  # held, not dropped
        with pytest.raises(RestartInterrupt, match="peer"):
            again = _fire_later(it, 0.05)  # the watcher's next delivery, after the import
            time.sleep(5)
        again.join()
        assert not it.armed
    finally:
        it.uninstall()
        sys.modules.pop("rg_slow_import_main", None)


def test_an_import_around_the_wrapped_call_does_not_hold_its_interrupt(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script whose top-level code (run by an import) calls the wrapped function: the
    import began before the round; only the frames inside the round count."""
    import sys

    from rankguard.inprocess.interrupt import inside_import

    monkeypatch.syspath_prepend(str(tmp_path))
    seen: dict[str, bool] = {}

    def round_call(fn: Any) -> Any:  # stands for the wrapper's call of the user's function
        return fn()

    def user_function() -> None:
        frame = sys._getframe()
        seen["whole stack"] = inside_import(frame)
        seen["inside the round"] = inside_import(frame, round_call.__code__)

    sys.modules["rg_probe_hooks"] = type(sys)("rg_probe_hooks")
    sys.modules["rg_probe_hooks"].run = lambda: round_call(user_function)  # type: ignore[attr-defined]
    (tmp_path / "rg_script_module.py").write_text("import rg_probe_hooks\nrg_probe_hooks.run()\n")
    try:
        import rg_script_module  # type: ignore[import-not-found]  # noqa: F401
    finally:
        sys.modules.pop("rg_probe_hooks", None)
        sys.modules.pop("rg_script_module", None)
    assert seen == {"whole stack": True, "inside the round": False}


def test_another_threads_import_is_not_interrupted_either(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    _slow_module(tmp_path, "rg_slow_import_thread", 0.6)
    seen: list[str] = []
    t, it = _armed_thread(seen, lambda: importlib.import_module("rg_slow_import_thread"))
    try:
        deadline = time.monotonic() + 5
        while "rg_slow_import_thread" not in sys.modules and time.monotonic() < deadline:
            time.sleep(0.005)
        it.fire("peer")  # inside the import: held
        assert it.held_in_import == 1 and it.armed
        while "done" not in seen and t.is_alive():
            time.sleep(0.01)
        it.fire("peer")
        t.join(timeout=10)
        assert seen == ["done", "interrupted"]
    finally:
        sys.modules.pop("rg_slow_import_thread", None)
