"""The Broker's nats-py client: headers read as nats-py reads them, faster."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsPyClient
from structlog.testing import capture_logs

from agentreach.broker import Broker, BrokerError, ConnectionBroke, EmbeddedServer, listen
from agentreach.broker.client import Client, _awaits_answer
from tests.e2e.test_startup_and_restarts import RestartableServer

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


async def test_a_write_given_up_during_an_outage_never_lands_later(tmp_path: Path):
    """A JetStream write whose caller timed out while the server was away is not sent when
    the connection comes back (nats-py sent it then: a chaos run's dispatch, 17 s late, ran
    a task twice). A message that waits for no answer is still sent once it is back."""
    async with RestartableServer(tmp_path / "nats") as server, Broker(server.url) as broker:
        await broker.js.add_stream(name="OUTAGE", subjects=["outage.>"])
        await server.stop()
        with pytest.raises(BrokerError):
            await broker.publish("outage.write", b"given up", timeout=0.3)
        await broker.publish_core("outage.core", b"waits for nothing")
        await server.start()
        await asyncio.wait_for(broker.link.came_back(0), 15)
        await broker.publish("outage.write", b"after")
        await broker.flush()
        stored = (await broker.js.stream_info("OUTAGE")).state.messages
        kept = [(await broker.js.get_msg("OUTAGE", seq)).data for seq in range(1, stored + 1)]
    assert kept == [b"waits for nothing", b"after"]


async def test_a_write_during_a_short_outage_waits_for_the_connection(tmp_path: Path):
    """A write made while the connection is coming back is sent once it is back, within the
    write's own timeout: stored once, acknowledged."""
    async with RestartableServer(tmp_path / "nats") as server, Broker(server.url) as broker:
        await broker.js.add_stream(name="OUTAGE", subjects=["outage.>"])
        await server.stop()
        written = asyncio.create_task(broker.publish("outage.write", b"on time", timeout=15))
        await server.start()
        ack = await asyncio.wait_for(written, 20)
        assert (await broker.js.get_msg("OUTAGE", ack.seq)).data == b"on time"
        assert (await broker.js.stream_info("OUTAGE")).state.messages == 1


async def test_a_write_carrying_a_decision_made_before_a_break_is_not_sent_after_it(
    tmp_path: Path,
):
    """A router decided on a read made before the connection broke; its dispatch, retried
    until the server came back 17 s later, went out then and ran a task beside another
    replica's route (a chaos run). Written with ``since_break``, it is refused unsent once
    the connection broke; one decided after the reconnect goes out."""
    async with RestartableServer(tmp_path / "nats") as server, Broker(server.url) as broker:
        await broker.js.add_stream(name="OUTAGE", subjects=["outage.>"])
        decided = broker.link.breaks
        await server.stop()
        written = asyncio.create_task(
            broker.publish("outage.write", b"stale", timeout=15, since_break=decided)
        )
        await server.start()
        with pytest.raises(ConnectionBroke, match="the connection broke"):
            await asyncio.wait_for(written, 20)
        await broker.publish("outage.write", b"fresh", since_break=broker.link.breaks)
        stored = (await broker.js.stream_info("OUTAGE")).state.messages
        kept = [(await broker.js.get_msg("OUTAGE", seq)).data for seq in range(1, stored + 1)]
    assert kept == [b"fresh"]


def test_only_publishes_naming_a_reply_are_dropped_from_the_reconnect_buffer():
    """What nats-py buffered when the connection broke: a publish that waits for an answer
    on this connection (a write, a request, a pull) is dropped; acknowledgements, plain
    messages and subscriptions are kept."""
    assert _awaits_answer(b"PUB $JS.API.STREAM.INFO.S _INBOX.abc.1 0\r\n\r\n")
    assert _awaits_answer(b"HPUB reach.tasks.x _INBOX.abc.2 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")
    assert not _awaits_answer(b"PUB $JS.ACK.S.C.1.2.3.4.0 4\r\n+ACK\r\n")
    assert not _awaits_answer(b"HPUB reach.events.x 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")
    assert not _awaits_answer(b"SUB _INBOX.abc.* 7\r\n")
    assert not _awaits_answer(b"PONG\r\n")


async def test_a_server_without_jetstream_is_named_at_connecting(tmp_path: Path):
    """A nats-server started without -js: every JetStream call only timed out after it, and
    the services said "waiting for JetStream: the cluster may be electing a leader" (an
    outside trial, on a single server). Connecting now says what is missing."""
    config = tmp_path / "plain.conf"
    async with EmbeddedServer(
        port=-1, store_dir=tmp_path / "store", config=config, config_text="listen: 127.0.0.1:-1\n"
    ) as server:
        with capture_logs() as plain:
            async with Broker(server.url):
                pass
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "js") as server:
        with capture_logs() as with_jetstream:
            async with Broker(server.url):
                pass
    said = [e["event"] for e in plain if e["log_level"] == "warning"]
    assert any(line.startswith("this NATS server runs without JetStream") for line in said)
    assert not [e for e in with_jetstream if "without JetStream" in e["event"]]
