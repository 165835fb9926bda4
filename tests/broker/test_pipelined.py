"""Publishes in flight together: stored in order, each message's own outcome."""

from __future__ import annotations

import asyncio

import nats.aio.msg
import nats.js.errors
import pytest

from agentreach.broker import (
    Broker,
    EmbeddedServer,
    NoStreamError,
    Outgoing,
    Topology,
    WrongLastSequence,
    provision,
    read_stream,
)
from agentreach.broker.embedded import PID_FILE
from agentreach.broker.errors import BrokerTimeout
from agentreach.broker.pipelined import PipelinedPublisher, _ack_of
from agentreach.envelopes import Liveness
from tests.support import stopped, until_true


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


async def test_a_write_in_flight_as_the_connection_breaks_is_made_again_once_back(tmp_path):
    """A write whose ack went to a connection that broke (a node that exited in a rolling
    restart) waited out its whole timeout, 5 s in a trial, before it was made again. Once
    the connection is back it is made again at once (deduplicated by its Nats-Msg-Id), and
    stored once."""
    async with (
        EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server,
        Broker(server.url, request_timeout=20.0) as broker,
    ):
        await provision(broker, Topology.default(broker.names))
        subject = broker.names.task("in-flight")
        await stopped(int((tmp_path / "nats" / PID_FILE).read_text()))  # answers nothing
        loop = asyncio.get_running_loop()
        writing = asyncio.create_task(
            broker.publish(subject, b"{}", headers={"Nats-Msg-Id": "in-flight-1"})
        )
        publisher = broker.shared(PipelinedPublisher)
        await until_true(lambda: _waiting(publisher), timeout=5)  # sent, not answered
        await server.kill()  # its ack will never come
        await server.restart()
        back_at = loop.time()
        ack = await asyncio.wait_for(writing, 25)
        took_s = loop.time() - back_at
        stored = await read_stream(broker, broker.names.tasks_stream, subject)
    assert took_s < 10, took_s  # not the 20 s timeout after the reconnect
    assert not ack.duplicate and len(stored) == 1


async def _waiting(publisher: PipelinedPublisher) -> bool:
    return bool(publisher._waiting)
