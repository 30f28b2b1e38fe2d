"""The agent's collect runs with the cyclic garbage collector paused, and leaves it as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.agent import gcpause
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_paused_turns_it_off_and_back_on_also_when_the_block_raises() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), gcpause.paused():
        raise KeyError("x")
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gcpause.paused(), gcpause.paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    with gcpause.paused():
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not turn it on under the outer
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_the_agents_collect_runs_paused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def spy(self: Agent, per_container: bool) -> list[object]:
        seen.append(gc.isenabled())
        return [object()]

    monkeypatch.setattr(Agent, "_collect", spy)
    config = AgentConfig("127.0.0.1:9", "t", "t", tmp_path, root_pid=1, docker_socket=None)
    agent = Agent(config)
    try:
        agent.collect()
        agent.collect_all()
    finally:
        agent.channel.close()
    assert seen == [False, False]
    assert gc.isenabled()
