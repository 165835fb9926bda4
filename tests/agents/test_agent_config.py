"""Declaring an Agent: mistakes are caught when the decorator runs, naming the option."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, AgentConfigError, TaskContext


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Agent("has space"), "agent_id 'has space'"),
        (lambda: Agent("a", heartbeat_interval=0), "heartbeat_interval"),
        (lambda: Agent("a", startup_delay=-1), "startup_delay"),
        (lambda: Agent("a").handler("a.b"), "topic 'a.b'"),
        (lambda: Agent("a").handler("t", capacity=0), "capacity of 't'"),
        (lambda: Agent("a").handler("t", deadline_ms=0), "deadline_ms of 't'"),
        (lambda: Agent("a").handler("t", max_attempts=0), "max_attempts of 't'"),
        (lambda: Agent("a", ack_wait=0), "ack_wait"),
        (lambda: Agent("a", tags={"pool=a": "x"}), "tag 'pool=a'"),
        (lambda: Agent("a", tags={"a,b": "x"}), "tag 'a,b'"),
        (lambda: Agent("a", tags={"": "x"}), "tag ''"),
        (lambda: Agent("a", tags={" role": "x"}), "tag ' role'"),
        (lambda: Agent("a", tags={"role": 1}), "tag 'role'"),
        (lambda: Agent("a", tags=["role=worker"]), "tags"),
        # A number given as text was a TypeError from inside a comparison (a walkthrough).
        (lambda: Agent("a", startup_delay="0"), "startup_delay must be a number, got '0'"),
        (lambda: Agent("a", max_deliver=2.5), "max_deliver must be a whole number"),
        (lambda: Agent("a", drain_timeout=True), "drain_timeout must be a number"),
        (lambda: Agent("a").handler("t", capacity="4"), "capacity must be a whole number"),
    ],
)
def test_bad_options_name_themselves(build, message):
    """Each wrong option raises AgentConfigError that names it."""
    with pytest.raises(AgentConfigError, match=message.replace(".", r"\.")):
        build()


def test_bare_handler_decorator_says_to_name_the_topic():
    """@agent.handler without its topic says how to write it, not that a function is no
    valid topic."""
    agent = Agent("a")
    with pytest.raises(AgentConfigError, match=r'use @agent\.handler\("topic"\)') as caught:

        @agent.handler
        async def summarize(ctx, payload): ...

    assert "<function" not in str(caught.value)
    assert not agent.handlers


def test_an_empty_agent_id_is_refused_not_replaced(tmp_path):
    """Agent("") is refused; it does not fall back to the identity file (None does)."""
    identity = tmp_path / "agent-id"
    with pytest.raises(AgentConfigError, match="agent_id ''"):
        Agent("", identity_file=identity)
    assert not identity.exists()


def test_tags_that_selectors_can_name_are_kept():
    """Tag values may hold '=' and spaces inside; the keys and values are kept as given."""
    tags = {"role": "worker", "region": "cn-east", "expr": "a=b", "team": "data infra"}
    assert Agent("a", tags=tags).card().tags == tags


def test_handler_must_take_ctx_and_payload():
    """A handler with the wrong signature is refused at registration."""
    agent = Agent("a")
    with pytest.raises(AgentConfigError, match=r"must take \(ctx, payload\)"):
        agent.handler("t")(lambda payload: payload)

    def keyword_only(ctx: TaskContext, *, payload: object) -> object:  # failed every run
        return payload

    with pytest.raises(AgentConfigError, match=r"must take \(ctx, payload\), both positional"):
        agent.handler("t")(keyword_only)


def test_a_topic_has_one_handler():
    """Registering a second handler for a topic is refused."""
    agent = Agent("a")
    agent.handler("t")(lambda ctx, payload: payload)
    with pytest.raises(AgentConfigError, match="already has a handler"):
        agent.handler("t")(lambda ctx, payload: payload)


def test_card_lists_intents_with_version_and_capacity():
    """The card carries each intent's version, capacity and deadline, and the tags."""
    agent = Agent("a", tags={"region": "cn-east"})
    agent.handler("refund", version="2.1", capacity=100, deadline_ms=8000)(lambda c, p: p)
    card = agent.card(epoch=3)
    assert card.intents["refund"].version == "2.1"
    assert card.intents["refund"].capacity == 100
    assert card.intents["refund"].deadline_ms == 8000
    assert card.tags == {"region": "cn-east"} and card.epoch == 3
    assert agent.capacity == 100


async def test_an_agent_without_handlers_does_not_start(nats_url):
    """Running an agent with no handlers is a configuration error."""
    with pytest.raises(AgentConfigError, match="has no handlers"):
        async with Agent("empty", startup_delay=0).running(nats_url):
            pass


async def test_the_start_up_delay_is_said_before_it_is_waited(broker, coordinator):
    """A new agent waits a random part of ``startup_delay`` (60 s by default) before it
    registers: it says so at once, with how to start at once, instead of being silent."""
    agent = Agent("delayed-1", startup_delay=0.2)

    @agent.handler("noop")
    async def noop(ctx: TaskContext, payload: dict) -> dict:
        return {}

    with capture_logs() as logs:
        async with agent.running(broker=broker):
            pass
    said = [e for e in logs if e["event"] == "registering after a random start-up delay"]
    assert len(said) == 1
    assert 0 <= said[0]["delay_s"] <= 0.2 and said[0]["startup_delay"] == 0.2
    assert "startup_delay=0" in said[0]["hint"]
    assert logs.index(said[0]) < [e["event"] for e in logs].index("agent serving")
