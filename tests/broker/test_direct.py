"""Batched direct reads of stored messages: by subject, and through the subject index."""

from __future__ import annotations

import asyncio

import pytest

from agentreach.broker import StreamNotFound, direct
from agentreach.broker.direct import (
    LastValues,
    indexed_messages_on,
    last_of_each,
    messages_on,
    subject_counts,
    subject_matches,
)
from agentreach.broker.immediate import subscribe_immediate


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


async def test_an_indexed_read_takes_no_message_written_after_its_count(broker, monkeypatch):
    """The count and the last values go out together, and may be answered either side of a
    new message: a subject counted with one, whose last message came after the count, is
    read again as of the counted moment (the counted message, not the newer one)."""
    names = broker.names
    subject = names.event("progress", "t", "trace-3", "m-3", "agent-a")
    await broker.publish(subject, b"counted")
    counted = asyncio.Event()
    count, read_last = direct.subject_counts, direct._last_values_in_one_answer

    async def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return await count(*args, **kwargs)
        finally:
            counted.set()

    async def reading_after_a_new_one(*args, **kwargs):  # type: ignore[no-untyped-def]
        await counted.wait()
        await broker.publish(subject, b"written after the count")
        return await read_last(*args, **kwargs)

    monkeypatch.setattr(direct, "subject_counts", counting)
    monkeypatch.setattr(direct, "_last_values_in_one_answer", reading_after_a_new_one)
    wildcard = names.events_of_message_in_trace("trace-3", "m-3")
    found = await indexed_messages_on(broker, names.events_stream, wildcard)
    assert [m.data for m in found] == [b"counted"]
    stored = await messages_on(broker, names.events_stream, subject)
    assert len(stored) == 2  # the newer message was there to be mistaken for the counted one


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


async def test_last_values_asked_in_one_turn_are_read_in_one_request(broker):
    """Each caller gets the last message of each subject its own pattern matches, and the
    server is asked once for all of them."""
    names = broker.names
    for message in ("m-5", "m-6"):
        for sender in ("a", "b"):
            subject = names.event("routed", "t", "trace-5", message, sender)
            await broker.publish(subject, f"{message}/{sender}".encode())
    await broker.publish(names.event("routed", "t", "trace-5", "m-5", "a"), b"m-5/a again")
    reads = broker.shared(LastValues)
    patterns = [names.events_of_message_in_trace("trace-5", m) for m in ("m-5", "m-6", "m-0")]
    asked: list[bytes] = []
    subject = f"$JS.API.DIRECT.GET.{names.events_stream}"
    watching = await subscribe_immediate(broker.nc, subject, lambda msg: asked.append(msg.data))
    found = await asyncio.gather(*(reads.read(names.events_stream, p) for p in patterns))
    await broker.flush()  # every request sent has come back to the watcher by now
    await watching.unsubscribe()
    assert len(asked) == 1
    assert [sorted(m.data.decode() for m in each) for each in found] == [
        ["m-5/a again", "m-5/b"],
        ["m-6/a", "m-6/b"],
        [],
    ]


async def test_a_caller_that_gives_up_leaves_the_read_to_the_others(broker):
    names = broker.names
    subject = names.event("routed", "t", "trace-7", "m-7", "a")
    await broker.publish(subject, b"kept")
    reads = broker.shared(LastValues)
    pattern = names.events_of_message_in_trace("trace-7", "m-7")
    leaving = asyncio.create_task(reads.read(names.events_stream, pattern))
    staying = asyncio.create_task(reads.read(names.events_stream, pattern))
    await asyncio.sleep(0)  # both have asked; the read goes out after this turn
    leaving.cancel()
    assert [m.data for m in await staying] == [b"kept"]
    assert leaving.cancelled()


async def test_a_failed_read_fails_every_caller_with_its_error(broker):
    reads = broker.shared(LastValues)
    outcomes = await asyncio.gather(
        reads.read("NO_SUCH_STREAM", "x.a.*"),
        reads.read("NO_SUCH_STREAM", "x.b.*"),
        return_exceptions=True,
    )
    assert all(isinstance(outcome, StreamNotFound) for outcome in outcomes)


async def test_readers_whose_answers_one_request_cannot_hold_are_read_each_alone(broker):
    """Together the two patterns match more subjects than the server answers at once (it
    refuses with 413 past about a thousand): each reader is then answered on its own."""
    names = broker.names
    writes = [
        broker.publish(names.event("progress", "t", f"trace-{group}", f"m-{n}", "a"), b"x")
        for group in ("8", "9")
        for n in range(600)
    ]
    await asyncio.gather(*writes)
    reads = broker.shared(LastValues)
    patterns = [f"{names.prefix}.event.*.t.trace-{group}.*.*" for group in ("8", "9")]
    found = await asyncio.gather(*(reads.read(names.events_stream, p) for p in patterns))
    assert [len(each) for each in found] == [600, 600]
    assert {m.subject.split(".")[4] for m in found[0]} == {"trace-8"}


async def test_readers_whose_answers_run_past_one_batch_are_read_each_alone(broker, monkeypatch):
    """An answer longer than the batch asked for (here 10 messages) leaves some pending: each
    reader is then answered on its own, with every message its pattern matches."""
    monkeypatch.setattr(direct, "BATCH", 1)
    names = broker.names
    for group in ("10", "11"):
        for n in range(6):
            await broker.publish(names.event("routed", "t", f"trace-{group}", f"m-{n}", "a"), b"x")
    reads = broker.shared(LastValues)
    patterns = [f"{names.prefix}.event.*.t.trace-{group}.*.*" for group in ("10", "11")]
    found = await asyncio.gather(*(reads.read(names.events_stream, p) for p in patterns))
    assert [len(each) for each in found] == [6, 6]


def test_subject_patterns_match_as_the_server_matches_them():
    assert subject_matches("a.*.c", "a.b.c")
    assert not subject_matches("a.*.c", "a.b.c.d")
    assert not subject_matches("a.*", "a")
    assert subject_matches("a.>", "a.b.c")
    assert not subject_matches("a.>", "a")
    assert subject_matches("a.b", "a.b")
    assert not subject_matches("a.b", "a.x")
