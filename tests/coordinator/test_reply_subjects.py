"""A request's reply subject is the requester's to choose: the coordinator answers only an
inbox, never a subject where its answer would be its own write (a card, a task)."""

from __future__ import annotations

from agentreach.agents import Agent
from agentreach.broker.messages import is_inbox
from agentreach.envelopes import AgentCard
from tests.conftest import FAST


def test_only_inboxes_are_answered():
    assert is_inbox("_INBOX.abc.1") and is_inbox("_INBOX_alice.abc")
    assert not is_inbox("$KV.reach_agents.x") and not is_inbox("reach.task.summarize")
    assert not is_inbox("reach.wf.cancel.w1") and not is_inbox("") and not is_inbox("x._INBOX")


async def test_a_status_request_aimed_at_an_agent_s_card_writes_nothing_there(
    broker, start_coordinator
):
    agent = Agent("carded-1", startup_delay=0, heartbeat_interval=0.5)

    @agent.handler("work")
    async def work(ctx, payload):  # type: ignore[no-untyped-def]
        return payload

    async with start_coordinator(FAST), agent.running(broker=broker):
        cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
        before = await cards.get("carded-1")
        nc = broker.nc  # any party may name any reply subject
        card_subject = f"$KV.{broker.names.agents_bucket}.carded-1"
        await nc.publish(broker.names.status, b"", reply=card_subject)
        answer = await nc.request(broker.names.status, b"", timeout=5)  # answered after it
        after = await cards.get("carded-1")
    assert b'"replica"' in answer.data  # an inbox is answered
    assert before is not None and after is not None
    assert after.revision == before.revision and after.value.agent_id == "carded-1"
