"""Batched direct reads of stored messages: by subject, and through the subject index."""

from __future__ import annotations

import pytest

from agentreach.broker import StreamNotFound
from agentreach.broker.direct import (
    indexed_messages_on,
    last_of_each,
    messages_on,
    subject_counts,
)


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


async def test_the_index_counts_each_subjects_messages_as_of_a_sequence(broker):
    names = broker.names
    for kind in ("routed", "progress", "progress", "completed"):
        ack = await broker.publish(names.event(kind, "t", "trace-3", "m-3", "a"), b"x")
    counts, counted_at = await subject_counts(
        broker, names.events_stream, names.events_of_message_in_trace("trace-3", "m-3")
    )
    assert counts == {
        names.event("routed", "t", "trace-3", "m-3", "a"): 1,
        names.event("progress", "t", "trace-3", "m-3", "a"): 2,
        names.event("completed", "t", "trace-3", "m-3", "a"): 1,
    }
    assert counted_at == ack.seq


async def test_the_last_message_of_a_subject_is_read_as_of_a_sequence(broker):
    """How an indexed read takes the one message it counted on a subject: a message written
    there since the count is not taken in its place (the counted one would be skipped)."""
    names = broker.names
    subject = names.event("routed", "t", "trace-4", "m-4", "a")
    first = await broker.publish(subject, b"first")
    await broker.publish(subject + "-later", b"elsewhere")  # the stream moves on
    await broker.publish(subject, b"second")
    [only] = await last_of_each(broker, names.events_stream, [subject], up_to_seq=first.seq)
    assert only.data == b"first"


async def test_counting_on_a_stream_that_does_not_exist_says_so(broker):
    with pytest.raises(StreamNotFound):
        await subject_counts(broker, "NO_SUCH_STREAM", "x.>")
