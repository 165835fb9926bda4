"""The Broker's nats-py client: headers read as nats-py reads them, faster."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsPyClient

from agentreach.broker import Broker, listen
from agentreach.broker.client import Client

# Names and values with what trips a parser: white space of every kind (\x1c-\x1f count
# as white space to Python), colons, non-ASCII and invalid UTF-8, empty parts.
_pieces = st.sampled_from(
    [b"", b" ", b"\t", b"\x0b", b"\x1c", b"\x1f", b":", b"a", b"Nats-Msg-Id", b"\xc3\xa9",
     b"\xff", b"x y", b"Reach-Trace-Id", b"01a2-b3"]
)  # fmt: skip
_text = st.lists(_pieces, max_size=6).map(b"".join)
_lines = st.lists(st.tuples(_text, st.sampled_from([b": ", b":", b""]), _text), max_size=6)


@given(_lines)
@settings(max_examples=500)
def test_a_header_block_parses_exactly_as_nats_py_parses_it(lines):
    raw = b"\r\n".join(name + sep + value for name, sep, value in lines) + b"\r\n\r\n"
    assert Client._parse_header_lines(raw) == NatsPyClient._parse_header_lines(raw)


async def test_headers_arrive_through_nats_as_they_were_sent(broker: Broker):
    """A message's headers, read by the Broker's connection, are the ones published."""
    assert isinstance(broker.nc, Client)
    sent = {"Nats-Msg-Id": "m-1", "Reach-Trace-Id": "t-1", "Reach-Note": "été: yes"}
    arrived: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    listening = await listen(broker, "client.headers", lambda msg: arrived.set_result(msg.headers))
    await broker.nc.publish("client.headers", b"{}", headers=sent)
    assert await asyncio.wait_for(arrived, timeout=5) == sent
    await listening.close()


async def test_a_flush_sends_what_is_buffered_before_its_ping(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
):
    """nats-py wrote a flush's PING ahead of a SUB still buffered: the PONG came before the
    server had the subscription."""
    transport = broker.nc._transport
    sent: list[bytes] = []
    write, writelines = transport.write, transport.writelines
    monkeypatch.setattr(transport, "write", lambda data: (sent.append(data), write(data))[1])
    monkeypatch.setattr(
        transport, "writelines", lambda lines: (sent.extend(lines), writelines(lines))[1]
    )
    await broker.subscribe("client.flushed")
    await broker.flush()
    stream = b"".join(sent)
    assert b"SUB client.flushed" in stream
    assert stream.index(b"SUB client.flushed") < stream.index(b"PING")


async def test_a_peer_s_publish_after_a_flush_reaches_every_new_subscription(
    broker: Broker, nats_url: str
):
    """Subscribe, flush, a peer publishes, 1,000 times: 1 in 20 to 1 in 300 were missed."""
    subscriptions = []
    async with Broker(nats_url, names=broker.names, name="peer") as peer:
        for i in range(1000):
            subscriptions.append(await broker.subscribe(f"client.new.{i}"))
            await broker.flush()
            await peer.publish_core(f"client.new.{i}", b"x")
        await peer.flush()
    await broker.flush()
    for subscription in subscriptions:
        assert await subscription.next(timeout_s=5)
