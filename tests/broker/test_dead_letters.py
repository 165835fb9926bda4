"""A dead letter always fits in one message of the server, cut as it must be."""

from __future__ import annotations

from agentreach.broker import Broker, read_stream
from agentreach.broker.dead_letters import HEADROOM, TRACE_ENDS
from agentreach.broker.lifecycle import event_for, event_message
from agentreach.envelopes import Task, decode_dead_letter
from tests.support import letter_of

LIMIT = 64 * 1024  # the server's largest message, as the letter is fitted to it


async def test_a_trace_too_large_even_bare_keeps_its_ends(broker: Broker, monkeypatch) -> None:
    """A workflow signalled 15,000 times failed: its letter's trace was too large for the
    server even without the events' details, the publish failed, and was tried again for
    minutes (a drill). The letter keeps the first and the last events of its trace."""
    task = Task(v=1, message_id="noisy", trace_id="noisy", topic="flipper")
    said = [event_for(task, "signal_ignored", signal="flip", signal_seq=n) for n in range(1_000)]
    failed = await broker.publish_all([event_message(broker, event) for event in said])
    assert not any(failed)
    monkeypatch.setattr(Broker, "max_payload", property(lambda self: LIMIT))
    await letter_of(broker, task, "expired")
    [stored] = await read_stream(broker, broker.names.dlq_stream, broker.names.dlq_wildcard)
    letter = decode_dead_letter(stored.data)
    assert len(stored.data) <= LIMIT - HEADROOM and letter.truncated
    seqs = [event.detail.get("signal_seq") for event in letter.trace]
    assert len(letter.trace) == 2 * TRACE_ENDS and seqs == [None] * 2 * TRACE_ENDS  # bare
    assert [e.at_ms for e in letter.trace] == sorted(e.at_ms for e in letter.trace)
