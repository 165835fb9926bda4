"""A request's reply subject is the requester's to choose: the coordinator answers only an
inbox, never a subject where its answer would be its own write (a card, a task)."""

from __future__ import annotations

import contextlib
import json

import msgspec
import nats

from agentreach.agents import Agent, ReachClient
from agentreach.broker import read_stream
from agentreach.broker.messages import is_inbox
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows.control import read_record
from agentreach.envelopes import AgentCard
from tests.conftest import FAST
from tests.support import eventually, until_true

QUIET_S = 0.3  # the bounded wait for an answer that must not come


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


# -- the red team's other variants: a trace, a call and a cancel as the reply subject ---------


async def _heard_while(broker, subject, ask):  # type: ignore[no-untyped-def]
    """What arrives on ``subject`` while ``ask()`` runs (it ends with a request answered in
    an inbox, the barrier), and in a bounded wait after it."""
    sub = await broker.nc.subscribe(subject)
    await broker.nc.flush()
    try:
        await ask()
        await broker.nc.flush()
        heard = []
        with contextlib.suppress(nats.errors.TimeoutError):
            while True:
                heard.append(await sub.next_msg(timeout=QUIET_S))
        return heard
    finally:
        await sub.unsubscribe()


async def _asked_twice(broker, subject: str, body: bytes, reply: str) -> None:  # type: ignore[no-untyped-def]
    """Asked with ``reply`` as the reply subject, then from an inbox: one subscription of the
    coordinator takes both in order, so the second answer leaves after the first would."""
    await broker.nc.publish(subject, body, reply=reply)
    await broker.nc.request(subject, body, timeout=5)


async def test_a_trace_request_aimed_at_an_agent_s_card_writes_nothing_there(
    broker, start_coordinator
):
    agent = Agent("carded-2", startup_delay=0)

    @agent.handler("work")
    async def work(ctx, payload):  # type: ignore[no-untyped-def]
        return payload

    async with start_coordinator(FAST), agent.running(broker=broker):
        cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
        before = await cards.get("carded-2")
        card = f"$KV.{broker.names.agents_bucket}.carded-2"
        ask = broker.names.trace_request("tester"), b'{"message_id": "m-1"}', card
        heard = await _heard_while(broker, card, lambda: _asked_twice(broker, *ask))
        after = await cards.get("carded-2")
    assert heard == []
    assert before is not None and after is not None
    assert after.revision == before.revision and after.value.agent_id == "carded-2"


async def test_a_call_aimed_at_another_agent_s_dispatch_subject_queues_nothing_there(
    broker, start_coordinator, watcher
):
    """The relay's result is a task: answered to the victim's dispatch subject, it would be
    the coordinator's dispatch of a task nobody routed."""
    relay, victim = Agent("relay-1", startup_delay=0), Agent("victim-2", startup_delay=0)
    ran: list[object] = []

    @relay.handler("relay")
    async def relay_it(ctx, payload):  # type: ignore[no-untyped-def]
        return payload["inner"]

    @victim.handler("work")
    async def work(ctx, payload):  # type: ignore[no-untyped-def]
        ran.append(payload)
        return payload

    names = broker.names
    forged = {"v": 1, "kind": "task", "message_id": "forged-1", "trace_id": "forged-1"}
    body = json.dumps({"inner": {**forged, "topic": "work", "payload": {"forged": True}}})
    dispatch = names.dispatch("victim-2", "P1")

    async def ask() -> None:
        headers = {"Nats-Msg-Id": "aimed-1"}
        await broker.nc.publish(names.call("relay"), body.encode(), reply=dispatch, headers=headers)
        barrier = await broker.nc.request(names.call("relay"), b'{"inner": 1}', timeout=10)
        assert barrier.data == b"1"  # an inbox is answered
        if watcher.ids_with("routed", {"aimed-1"}):  # taken in: answered once it ends
            await watcher.event("completed", message_id="aimed-1")

    async with (
        start_coordinator(FAST) as coordinator,
        relay.running(broker=broker),
        victim.running(broker=broker),
    ):
        await eventually(lambda: {"relay-1", "victim-2"} <= set(coordinator.directory.cards))
        heard = await _heard_while(broker, dispatch, ask)
    assert heard == [] and ran == []


async def test_a_status_request_aimed_at_a_workflow_s_cancel_does_not_cancel_it(
    broker, start_coordinator
):
    waits = wf.machine(
        "hold",
        {"hold": wf.state(next=[wf.go("done", event="go")]), "done": wf.state(terminal=True)},
    )
    config = msgspec.structs.replace(FAST, workflows={"waits": waits})
    async with start_coordinator(config), ReachClient(broker=broker, name="bob") as bob:
        instance, _ = await bob.publish("waits", {})

        async def running() -> bool:
            record = await read_record(broker, instance)
            return record is not None and record.status == "running"

        await until_true(running, timeout=10)
        cancel = broker.names.workflow_cancel(instance)
        ask = broker.names.status, b"", cancel
        heard = await _heard_while(broker, cancel, lambda: _asked_twice(broker, *ask))
        stored = await read_stream(broker, broker.names.workflows_stream, cancel)
        assert heard == [] and stored == []
        assert await running()


async def test_a_task_in_a_sender_s_name_replies_only_to_its_own_box_on_any_server(
    broker, start_coordinator, watcher
):
    """Not only on a secured server: a task on `reach.task.<topic>.<sender>` that names a
    plain inbox for its replies is dead-lettered as `invalid_envelope`, naming the rule
    (only the operators' bare form may name an inbox; protocol §10.1)."""
    headers = {"Nats-Msg-Id": "named-inbox-1", "Reach-Reply-To": "_INBOX.elsewhere"}
    subject = broker.names.task("echo", "rs-alice")
    async with start_coordinator(FAST):
        await broker.publish(subject, b'{"text": "hi"}', headers=headers)
        letter = await watcher.dead_letter("invalid_envelope", message_id="named-inbox-1")
    assert letter.error is not None
    assert "Replies may not go to '_INBOX.elsewhere'" in letter.error.message
    assert "a sender's replies go to its own box" in letter.error.message
