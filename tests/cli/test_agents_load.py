"""An agent's LOAD is its last heartbeat's only while it is live: OFFLINE or STOPPED, that
heartbeat says nothing of now (a dead agent read as busy)."""

from __future__ import annotations

from agentreach.cli.agent_rows import Row
from agentreach.cli.agents import render
from agentreach.dashboard.top import _agents
from agentreach.envelopes import AgentCard, Heartbeat, Liveness, LivenessState

BEAT = Heartbeat(agent_id="a1", epoch=1, seq=9, interval_s=15.0, in_flight=1, free_slots=1)


def row(state: LivenessState) -> Row:
    card = AgentCard(agent_id="a1", intents={})
    return Row("a1", card, Liveness(agent_id="a1", state=state, since_ms=1), BEAT, 2.0)


def test_reach_agents_shows_no_load_for_an_offline_agent():
    assert " 1/2 " in render([row("ONLINE")])
    assert " 1/2 " not in render([row("OFFLINE")])


def test_reach_top_shows_no_load_for_an_offline_agent():
    def agent(state: str) -> dict:
        beat = {"in_flight": 1, "free_slots": 1}
        return {"agent_id": "a1", "state": state, "quarantined": False, "heartbeat": beat,
                "queues": {}, "breakers": []}  # fmt: skip

    assert "1/2" in _agents([agent("ONLINE")])
    assert "1/2" not in _agents([agent("OFFLINE")]) and "1/2" not in _agents([agent("STOPPED")])
