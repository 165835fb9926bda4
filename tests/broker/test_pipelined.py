"""Publishes in flight together: stored in order, each message's own outcome."""

from __future__ import annotations

import nats.aio.msg
import nats.js.errors
import pytest

from agentreach.broker import NoStreamError, Outgoing, WrongLastSequence, read_stream
from agentreach.broker.errors import BrokerTimeout
from agentreach.broker.pipelined import _ack_of
from agentreach.envelopes import Liveness


def _verdict(agent_id: str) -> Liveness:
    return Liveness(agent_id=agent_id, state="ONLINE", since_ms=1)


async def test_a_batch_is_stored_in_the_order_given(broker):
    """Every message of the batch is acknowledged, and the stream holds them in order."""
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    batch = [verdicts.put_message(f"agent-{i}", _verdict(f"agent-{i}")) for i in range(50)]
    assert await broker.publish_all(batch) == [None] * 50
    stored = await read_stream(broker, f"KV_{verdicts.name}", f"$KV.{verdicts.name}.>")
    assert [m.subject for m in stored] == [m.subject for m in batch]
    entry = await verdicts.get("agent-7")
    assert entry is not None and entry.value.agent_id == "agent-7"


async def test_each_message_gets_its_own_outcome(broker):
    """A refused or unanswered message fails alone; the others of the batch are stored."""
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    good = verdicts.put_message("fine", _verdict("fine"))
    stale = Outgoing(good.subject, good.data, {"Nats-Expected-Last-Subject-Sequence": "999"})
    nowhere = Outgoing("no.stream.listens.here", b"{}")
    results = await broker.publish_all([good, stale, nowhere, good])
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], WrongLastSequence)
    assert isinstance(results[2], NoStreamError) and "no.stream.listens.here" in str(results[2])


async def test_a_message_nobody_acknowledges_times_out(broker):
    """A plain subscriber on the subject answers nothing: a timeout, named, not a hang."""
    subscription = await broker.nc.subscribe("plain.listener")
    try:
        [result] = await broker.publish_all([Outgoing("plain.listener", b"x")], timeout=0.2)
    finally:
        await subscription.unsubscribe()
    assert isinstance(result, BrokerTimeout) and "plain.listener" in str(result)


async def test_an_empty_batch_sends_nothing(broker):
    assert await broker.publish_all([]) == []


def test_an_ack_of_an_unknown_shape_is_a_refusal_not_a_crash():
    """An error without JetStream's fields, or an unreadable ack, names what came back."""
    for data in (b'{"error": {"text": "odd"}}', b"not json"):
        msg = nats.aio.msg.Msg(_client=None, subject="_INBOX.x.1", data=data)  # type: ignore[arg-type]
        with pytest.raises(nats.js.errors.APIError) as raised:
            _ack_of(msg)
        assert "odd" in str(raised.value) or "not json" in str(raised.value)
