"""The broker boundary: publish with dedup, nats-py errors translated, reading streams."""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlparse

import pytest
from nats.aio.client import Server

from agentreach.broker import (
    Auth,
    Broker,
    BrokerError,
    ConnectError,
    ConsumerNotFound,
    EmbeddedServer,
    EmbeddedServerError,
    NoStreamError,
    StreamNotFound,
    read_stream,
)
from agentreach.broker.errors import translated
from agentreach.broker.urls import jittered_reconnect, server_list
from agentreach.broker.watch import BucketWatch


async def test_same_msg_id_is_stored_once(broker):
    """A repeated Nats-Msg-Id is acknowledged as a duplicate and not stored again."""
    subject = broker.names.task("echo")
    first = await broker.publish(subject, b"{}", headers={"Nats-Msg-Id": "same"})
    second = await broker.publish(subject, b"{}", headers={"Nats-Msg-Id": "same"})
    assert not first.duplicate and second.duplicate
    assert second.seq == first.seq


async def test_publish_without_stream_is_no_stream_error(broker):
    """Publishing where no stream listens says to provision."""
    with pytest.raises(NoStreamError, match="reach provision"):
        await broker.publish("nowhere.at.all", b"x")


async def test_errors_are_translated_by_code(broker):
    """Missing stream and consumer become typed errors carrying the JetStream code."""
    with pytest.raises(StreamNotFound) as stream, translated():
        await broker.js.stream_info("NO_SUCH_STREAM")
    with pytest.raises(ConsumerNotFound) as consumer, translated():
        await broker.js.consumer_info(broker.names.tasks_stream, "no-such-consumer")
    assert stream.value.err_code == 10059
    assert consumer.value.err_code == 10014


async def test_unreachable_server_fails_fast():
    """A URL with no server is a ConnectError within seconds, not a retry loop, saying
    what to check (an outside trial's "[Errno 111] …" said nothing more)."""
    started = time.monotonic()
    with pytest.raises(ConnectError, match=r"cannot connect to NATS at nats://127\.0\.0\.1:1") as e:
        async with Broker("nats://127.0.0.1:1"):
            pass
    assert time.monotonic() - started < 10
    assert "nothing listens there: is the NATS server running" in str(e.value)


async def test_a_broker_cannot_be_reopened(nats_url):
    """Reuse after close is refused."""
    broker = Broker(nats_url)
    async with broker:
        pass
    with pytest.raises(BrokerError, match="cannot be opened twice"):
        await broker.__aenter__()


async def test_read_stream_returns_matching_messages_in_order(broker):
    """Only the filtered subjects, oldest first; nothing for an unknown id."""
    names = broker.names
    for event in ("routed", "accepted", "completed"):
        await broker.publish(names.event(event, "echo", "t1", "m1", "a1"), event.encode())
    await broker.publish(names.event("routed", "echo", "t2", "m2", "a1"), b"other")
    found = await read_stream(broker, names.events_stream, names.events_of_message("m1"))
    assert [m.data for m in found] == [b"routed", b"accepted", b"completed"]
    assert found[0].timestamp_ns <= found[-1].timestamp_ns
    assert await read_stream(broker, names.events_stream, names.events_of_message("m3")) == []


async def test_bucket_watch_sees_initial_values_changes_and_deletes(broker):
    """A watch yields what is there, then each put and delete, with no sentinels."""
    kv = await broker.kv(broker.names.liveness_bucket)
    await kv.put("a", b"1")
    async with BucketWatch(kv) as watch:
        changes = aiter(watch)
        first = await anext(changes)
        await kv.put("b", b"2")
        second = await anext(changes)
        await kv.delete("a")
        third = await anext(changes)
    assert (first.key, first.value) == ("a", b"1")
    assert watch.initial.is_set()
    assert (second.key, second.value) == ("b", b"2")
    assert (third.key, third.value) == ("a", None)


async def test_embedded_server_without_binary_is_a_clear_error(monkeypatch, tmp_path):
    """A missing nats-server binary is one sentence, not a traceback."""
    monkeypatch.setenv("REACH_NATS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(EmbeddedServerError, match="is not an executable file"):
        async with EmbeddedServer(port=-1, store_dir=tmp_path):
            pass


async def test_embedded_server_on_taken_port_names_the_port(nats_url, tmp_path):
    """Starting a second server on a taken port names the port and what to do."""
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "a") as first:
        with pytest.raises(EmbeddedServerError, match=f"port {first.port} on 127.0.0.1 is already"):
            async with EmbeddedServer(port=first.port, store_dir=tmp_path / "b"):
                pass


async def test_a_bucket_snapshot_reads_every_live_key_through_one_watch(broker):
    """snapshot() returns the keys present (not deleted ones) and stops, even when empty."""
    from agentreach.broker.watch import snapshot

    kv = await broker.kv(broker.names.leases_bucket)
    assert await snapshot(kv) == []
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    await kv.put("a", b"3")
    await kv.delete("b")
    (only,) = await snapshot(kv)
    assert (only.key, only.value) == ("a", b"3")
    assert only.written_ms > 0


def test_a_seed_list_is_split_and_each_entry_checked():
    """Comma-separated servers (with or without a scheme) are each a server; a malformed one
    is named, with its password hidden."""
    assert server_list(" nats://a:4222, b:4223 ,tls://c") == [
        "nats://a:4222",
        "nats://b:4223",
        "tls://c",
    ]
    with pytest.raises(ConnectError, match=r"'nats://u:\*\*\*@a:42x' is not a NATS server URL"):
        server_list("nats://ok:4222,nats://u:secret@a:42x")


def test_reconnects_try_every_server_before_any_twice_after_a_growing_jittered_pause():
    """The handler picks among the servers that failed least, and waits at most 0.25 s times
    2 per round of failures (capped at 2 s)."""
    choose = jittered_reconnect()
    pool = [
        Server(uri=urlparse("nats://a:1"), reconnects=2),
        Server(uri=urlparse("nats://b:1"), reconnects=1),
        Server(uri=urlparse("nats://c:1"), reconnects=1),
    ]
    picks = [choose(pool, {}) for _ in range(200)]
    assert {server.uri.netloc for server, _ in picks} == {"b:1", "c:1"}
    assert all(0 <= delay <= 0.5 for _, delay in picks)
    assert max(delay for _, delay in picks) > 0.25  # jittered over the whole range
    far = [Server(uri=urlparse("nats://a:1"), reconnects=30)]
    assert all(choose(far, {})[1] <= 2.0 for _ in range(50))


async def test_a_dead_first_seed_is_passed_over(nats_url):
    """With the first server of the seed list down, the connection is made to the next."""
    async with Broker(f"nats://127.0.0.1:1,{nats_url}") as broker:
        assert broker.connected
        assert nats_url.endswith(broker.server)


async def test_a_file_that_is_not_a_creds_file_is_named_so(nats_url, tmp_path):
    """nats-py's own error for a garbage creds file was "object of type 'NoneType' has no
    len()"; a string path is a path as well (Auth(creds="…") from the README)."""
    garbage = tmp_path / "billing.creds"
    garbage.write_text("this is not a creds file\n")
    with pytest.raises(ConnectError, match=r"is not a NATS \.creds file"):
        async with Broker(nats_url, auth=Auth(creds=str(garbage))):
            pass
    assert Auth(creds=str(garbage)).creds == garbage


async def test_a_first_connect_names_every_seed_that_failed():
    """When no seed answers, the error names each one's failure, not only the last tried."""
    ports = []
    for _ in range(2):
        with socket.socket() as probe:  # free now, and nobody listens on it
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    with pytest.raises(ConnectError) as raised:
        async with Broker(",".join(f"nats://127.0.0.1:{port}" for port in ports)):
            pass
    reason = str(raised.value).split(": ", 1)[1]
    for port in ports:
        assert f"('127.0.0.1', {port})" in reason


async def test_a_port_that_takes_the_connection_and_says_nothing_is_named_so():
    """Not a NATS port (another service, a hung server, one that wants TLS first): the error
    said only `TimeoutError` (an outside trial)."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectError) as raised:
            async with Broker(f"nats://127.0.0.1:{port}", connect_timeout=0.3):
                pass
    finally:
        listener.close()
    assert "the port took the connection but sent no NATS greeting within 0.3 s" in str(
        raised.value
    )


async def test_a_snapshot_taken_at_once_never_misses_values_still_on_their_way(broker):
    """A watch begun beside a busy server: the values it finds pending reach its snapshot,
    even when the server answers 'nothing pending' before its deliveries arrive."""
    from agentreach.broker.watch import snapshot

    kv = await broker.kv(broker.names.leases_bucket)
    for n in range(5):
        await kv.put(f"k{n}", b"v")
    short = [len(found) for found in await asyncio.gather(*(snapshot(kv) for _ in range(60)))]
    assert short == [5] * 60
