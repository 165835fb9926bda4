"""The first path end to end: intake → coordinator → agent → result, events, dead letters."""

from __future__ import annotations

import asyncio

import pytest

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, Rejected, TaskContext, TaskFailed
from agentreach.broker import read_stream
from agentreach.envelopes import headers as h
from tests.secured import operators_reply_to
from tests.support import until_true


def make_agent(agent_id: str = "worker-1") -> tuple[Agent, list[object]]:
    seen: list[object] = []
    agent = Agent(agent_id, tags={"role": "worker"}, startup_delay=0)

    @agent.handler("summarize", capacity=4)
    async def summarize(ctx: TaskContext, payload: dict) -> dict:
        seen.append(payload)
        return {"summary": payload["text"][:5], "trace_id": ctx.trace_id}

    return agent, seen


async def test_bare_body_with_headers_reaches_agent_and_replies(broker, coordinator, watcher):
    """A bare JSON body on core NATS with Reach headers (what `nats pub` sends) completes."""
    agent, seen = make_agent()
    inbox, subject = operators_reply_to(broker, "op1")
    replies = await broker.nc.subscribe(subject)
    async with agent.running(broker=broker):
        await broker.nc.publish(
            broker.names.task("summarize"),
            b'{"text": "hello world"}',
            headers={h.MSG_ID: "op-1", h.TRACE_ID: "trace-op-1", h.REPLY_TO: inbox},
        )
        completed = await watcher.event("completed", message_id="op-1")
        kinds = []
        while "result" not in kinds:
            reply = envelopes.decode_reply((await replies.next_msg(timeout=5)).data)
            if reply.__struct_config__.tag != "routed":  # the coordinator's notice to a box
                kinds.append(reply.__struct_config__.tag)
    assert seen == [{"text": "hello world"}]
    assert completed.trace_id == "trace-op-1"
    assert completed.detail["result"] == {"summary": "hello", "trace_id": "trace-op-1"}
    assert kinds == ["ack", "result"]
    assert [e.event for e in watcher.events if e.message_id == "op-1"] == [
        "routed",
        "accepted",
        "completed",
    ]


async def test_envelope_task_keeps_its_trace_id(broker, coordinator):
    """A full envelope task comes back as a result carrying the same trace_id."""
    agent, _ = make_agent()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("summarize", {"text": "abcdefgh"}, trace_id="order-42")
    assert result == {"summary": "abcde", "trace_id": "order-42"}


async def test_malformed_json_is_dead_lettered_with_its_path(broker, coordinator, watcher):
    """Malformed JSON and a wrongly typed envelope field end in REACH_DLQ as invalid_envelope."""
    await broker.nc.publish(broker.names.task("summarize"), b'{"text": ', headers={h.MSG_ID: "m1"})
    bad_field = (
        b'{"v": 1, "kind": "task", "message_id": "m2", "trace_id": "t2",'
        b' "topic": "summarize", "ttl_ms": "soon"}'
    )
    await broker.nc.publish(broker.names.task("summarize"), bad_field)
    first = await watcher.dead_letter("invalid_envelope", message_id="m1")
    second = await watcher.dead_letter("invalid_envelope", message_id="m2")
    assert first.raw == '{"text": '
    assert first.error is not None and first.error.type == "invalid_envelope"
    assert first.error.message.endswith("- at `$`")
    assert second.error is not None and "$.ttl_ms" in second.error.message

    async def both_stored() -> list[str] | None:
        # A subscriber hears a letter as the stream takes it, maybe before it is stored.
        stored = await read_stream(broker, broker.names.dlq_stream, broker.names.dlq_wildcard)
        return [m.subject for m in stored] if len(stored) >= 2 else None

    subjects = await until_true(both_stored, timeout=5)
    assert subjects == [broker.names.dlq("invalid_envelope", "summarize")] * 2


async def test_topic_without_agent_is_dead_lettered_no_route(broker, coordinator, watcher):
    """A topic no agent serves ends as no_route, and the invoker is told at once. No attempt
    ran, and the letter, its event and the reply say so (they said 1: the envelope's)."""
    async with ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("translate", {"text": "hola"})
    letter = await watcher.dead_letter("no_route", topic="translate")
    ended = await watcher.event("dead_lettered", message_id=letter.message_id)
    assert caught.value.reason == "no_route"
    assert caught.value.attempts == letter.attempts == ended.detail["attempts"] == 0
    assert letter.envelope is not None and letter.envelope.payload == {"text": "hola"}
    assert [e.event for e in letter.trace] == []  # nothing happened before it was refused


async def test_same_message_id_twice_runs_once(broker, coordinator, watcher):
    """Publishing one message_id twice executes the handler once (JetStream dedup)."""
    agent, seen = make_agent()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        task = client.task("summarize", {"text": "once only"}, message_id="dup-1")
        await client.submit(task)
        await client.submit(task)
        await client.publish("summarize", {"text": "after"}, message_id="after-1")
        await watcher.event("completed", message_id="after-1")
        await watcher.event("completed", message_id="dup-1")
    assert seen.count({"text": "once only"}) == 1


async def test_an_invoke_sent_again_with_its_id_gets_the_first_result(broker, coordinator):
    """A retry within the stream's duplicate window is not taken in again, and so not run
    again: it is answered with the earlier message's result, even while that one still runs
    (a retry after a timed-out call)."""
    agent, seen = make_agent()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        first = asyncio.create_task(
            client.invoke("summarize", {"text": "retried"}, message_id="again-1")
        )
        again = await client.invoke("summarize", {"text": "retried"}, message_id="again-1")
        assert await first == again == {"summary": "retri", "trace_id": "again-1"}
        with pytest.raises(TaskFailed) as ended:
            await client.invoke("nobody_serves_this", {}, message_id="again-2")
        with pytest.raises(TaskFailed) as again_ended:
            await client.invoke("nobody_serves_this", {}, message_id="again-2")
    assert seen.count({"text": "retried"}) == 1
    assert ended.value.error.type == again_ended.value.error.type == "no_route"


async def test_an_invoke_of_another_request_under_an_id_it_used_is_rejected(broker, coordinator):
    """An id this caller used for another request (an order id as the id of two steps): its
    resend within the duplicate window is dropped by the stream, and the invoke is refused
    (`duplicate_id`, saying what differs) instead of answered with the first one's result."""
    agent, seen = make_agent()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        await client.invoke("summarize", {"text": "first"}, message_id="order-7")
        with pytest.raises(Rejected) as other_payload:
            await client.invoke("summarize", {"text": "second"}, message_id="order-7")
        with pytest.raises(Rejected) as other_topic:
            await client.invoke("ship", {"text": "first"}, message_id="order-7")
        again = await client.invoke("summarize", {"text": "first"}, message_id="order-7")
    assert other_payload.value.reason == other_topic.value.reason == "duplicate_id"
    assert "'order-7' is of an earlier request of yours, which had another payload" in str(
        other_payload.value
    )
    assert "was sent on topic 'summarize', this one on 'ship'" in str(other_topic.value)
    assert again == {"summary": "first", "trace_id": "order-7"}
    assert seen == [{"text": "first"}]


async def test_an_invoke_under_another_caller_s_message_id_is_rejected_at_once(broker, coordinator):
    """An id another caller's message has: dropped by the stream as a duplicate, the invoke
    is refused at once (`duplicate_id`), without that message's result."""
    agent, seen = make_agent()
    async with (
        agent.running(broker=broker),
        ReachClient(broker=broker, name="billing") as billing,
        ReachClient(broker=broker, name="mallory") as mallory,
    ):
        await billing.invoke("summarize", {"text": "billing's"}, message_id="taken-1")
        with pytest.raises(Rejected) as refused:
            await mallory.invoke(
                "summarize", {"text": "mallory's"}, message_id="taken-1", execute_deadline_ms=3000
            )
    assert refused.value.reason == "duplicate_id"
    assert "'taken-1' is another caller's message" in refused.value.error.message
    assert seen.count({"text": "mallory's"}) == 0


async def test_an_invoke_whose_replies_are_lost_is_answered_from_its_events(
    broker, coordinator, monkeypatch
):
    """Replies are core NATS messages: one sent while the caller's connection is down (a
    server restart) is gone for good. Here every reply is lost: at the ack deadline the
    client reads the task's events, finds it accepted, and from then on reads them once a
    second, so the invoke returns the result well before its execute budget runs out."""
    from agentreach.broker.reply_box import ReplyBox

    monkeypatch.setattr(ReplyBox, "collect", lambda self, msg: None)  # nothing reaches the box
    agent, seen = make_agent()
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        async with asyncio.timeout(10):  # the execute budget is 60 s
            result = await client.invoke(
                "summarize",
                {"text": "lost replies"},
                ack_deadline_ms=300,
                execute_deadline_ms=60_000,
            )
    assert result == {"summary": "lost ", "trace_id": result["trace_id"]}
    assert seen == [{"text": "lost replies"}]
