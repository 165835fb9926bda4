"""Batched direct reads of stored messages: by subject, and through the subject index."""

from __future__ import annotations

from agentreach.broker.direct import indexed_messages_on, messages_on


async def test_an_indexed_read_finds_every_message_of_each_subject_in_order(broker):
    """Repeats on one subject (a retried attempt, progress) are all there, oldest first,
    and nothing of another task."""
    names = broker.names
    wanted = [
        ("routed", "coordinator"),
        ("accepted", "agent-a"),
        ("progress", "agent-a"),
        ("progress", "agent-a"),
        ("failed", "agent-a"),
        ("routed", "coordinator"),
        ("completed", "agent-b"),
    ]
    for kind, sender in wanted:
        await broker.publish(names.event(kind, "t", "trace-1", "m-1", sender), kind.encode())
        await broker.publish(names.event(kind, "t", "trace-2", "m-2", sender), b"other task")
    subject = names.events_of_message_in_trace("trace-1", "m-1")
    found = await indexed_messages_on(broker, names.events_stream, subject)
    assert [m.data.decode() for m in found] == [kind for kind, _ in wanted]
    assert found == await messages_on(broker, names.events_stream, subject)


async def test_an_indexed_read_of_nothing_is_empty(broker):
    names = broker.names
    subject = names.events_of_message_in_trace("no-trace", "no-message")
    assert await indexed_messages_on(broker, names.events_stream, subject) == []
