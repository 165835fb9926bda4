"""Reading a delivered message's position from its reply subject, as nats-py would."""

from __future__ import annotations

import asyncio

import nats.aio.msg
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from agentreach.broker import Broker, Delivery, Inbound, listen
from agentreach.broker.messages import Position, position_of


def _msg(reply: str) -> nats.aio.msg.Msg:
    return nats.aio.msg.Msg(_client=None, subject="$KV.b.k", reply=reply)  # type: ignore[arg-type]


def _as_nats_py_reads_it(msg: nats.aio.msg.Msg) -> Position:
    meta = msg.metadata
    return Position(
        stream=meta.stream,
        consumer=meta.consumer,
        delivered=meta.num_delivered,
        stream_seq=meta.sequence.stream,
        timestamp_ns=int(meta.timestamp.timestamp() * 1e9),
        pending=meta.num_pending,
    )


def test_position_of_a_v1_reply_subject():
    msg = _msg("$JS.ACK.KV_b.watch.2.42.7.1764567890123456789.3")
    assert position_of(msg) == Position("KV_b", "watch", 2, 42, 1764567890123456789, 3)
    at, nats_py = position_of(msg), _as_nats_py_reads_it(msg)
    assert (at.stream, at.consumer, at.delivered, at.stream_seq, at.pending) == (
        nats_py.stream,
        nats_py.consumer,
        nats_py.delivered,
        nats_py.stream_seq,
        nats_py.pending,
    )
    assert abs(at.timestamp_ns - nats_py.timestamp_ns) < 1_000  # nats-py goes through a float


def test_position_of_a_v2_reply_subject_with_domain_and_account():
    msg = _msg("$JS.ACK.hub.ACCHASH.KV_b.watch.1.42.7.1764567890123456789.3.rand")
    assert position_of(msg) == Position("KV_b", "watch", 1, 42, 1764567890123456789, 3)
    assert position_of(msg).stream_seq == msg.metadata.sequence.stream


def test_a_message_not_from_a_stream_is_refused():
    with pytest.raises(nats.errors.Error):
        position_of(_msg("_INBOX.abc.1"))


async def test_a_delivery_reads_what_the_server_wrote_in_its_reply_subject(broker: Broker):
    await broker.js.add_stream(api.StreamConfig(name="POSITIONS", subjects=["positions.>"]))
    for n in range(3):
        await broker.js.publish(f"positions.{n}", b"x")
    sub = await broker.js.pull_subscribe("positions.>", durable="reader", stream="POSITIONS")
    first, *_ = await sub.fetch(3, timeout=2)
    delivery = Delivery(first)
    assert (delivery.stream, delivery.stream_seq, delivery.num_delivered, delivery.pending) == (
        "POSITIONS",
        1,
        1,
        2,
    )
    assert abs(delivery.timestamp_ns - _as_nats_py_reads_it(first).timestamp_ns) < 1_000


async def test_a_delivery_kept_alive_is_not_delivered_again_until_the_block_ends(broker: Broker):
    """Inside ``kept_alive`` the delivery outlives its ack wait without coming back; once the
    block ends without an ack, the keep-alive has stopped and the server delivers it again."""
    await broker.js.add_stream(api.StreamConfig(name="KEPT", subjects=["kept.>"]))
    await broker.js.publish("kept.work", b"x")
    sub = await broker.js.pull_subscribe(
        "kept.>", durable="worker", stream="KEPT", config=api.ConsumerConfig(ack_wait=0.5)
    )
    (first,) = await sub.fetch(1, timeout=2)
    delivery = Delivery(first)
    async with delivery.kept_alive(0.15):
        await asyncio.sleep(1.2)  # work past two ack waits: its length is what is tested
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=0.3)
    (again,) = await sub.fetch(1, timeout=3)
    assert Delivery(again).num_delivered == 2
    await again.ack()


async def test_an_acknowledgement_applied_has_removed_a_work_queue_s_message(broker: Broker):
    """Once ``ack_applied`` returns, the server has applied it: the work queue's message is
    gone (an acknowledgement sent and forgotten may still be on its way when a server dies,
    and the message comes again). What settles it after that does nothing."""
    config = api.StreamConfig(name="APPLIED", subjects=["applied.>"], retention="workqueue")
    await broker.js.add_stream(config)
    stored = await broker.js.publish("applied.work", b"x")
    sub = await broker.js.pull_subscribe("applied.>", durable="worker", stream="APPLIED")
    (first,) = await sub.fetch(1, timeout=2)
    delivery = Delivery(first)
    await delivery.ack_applied()
    assert (await broker.js.stream_info("APPLIED")).state.messages == 0
    with pytest.raises(nats.js.errors.NotFoundError):
        await broker.js.get_msg("APPLIED", stored.seq)
    await delivery.ack()
    await delivery.nak()
    await delivery.in_progress()


async def test_listen_hands_each_message_over_as_it_is_read_until_closed(broker: Broker):
    """``listen`` gives the handler every message, in order, as an Inbound; after
    ``close`` nothing more arrives."""
    got: list[tuple[str, bytes]] = []
    ten = asyncio.Event()

    def handle(msg: Inbound) -> None:
        got.append((msg.subject, msg.data))
        if len(got) == 10:
            ten.set()

    listening = await listen(broker, "listen.*", handle)
    for n in range(10):
        await broker.nc.publish(f"listen.{n % 2}", str(n).encode())
    await asyncio.wait_for(ten.wait(), timeout=5)
    assert got == [(f"listen.{n % 2}", str(n).encode()) for n in range(10)]
    await listening.close()
    await broker.nc.publish("listen.0", b"late")
    await broker.flush()  # the server has seen the publish: had anyone listened, it was sent
    assert len(got) == 10


async def test_a_stream_s_delivery_pushed_onto_a_core_subject_is_not_handled(broker: Broker):
    """A party allowed to make a consumer, but not to publish on a coordinator's control
    subject, could have the server push a stream's messages there (nats-server checks no
    permission on a deliver subject). Core handlers (``subscribe``, ``listen``) drop them;
    a real publish on the subject is handled."""
    names = broker.names
    subject = f"{names.prefix}.ctl.pushed"
    handlers = await _CoreHandlers.on(broker, subject)
    config = api.ConsumerConfig(
        durable_name="pusher", deliver_subject=subject, filter_subject=names.task("pushed")
    )
    await broker.js.add_consumer(names.tasks_stream, config=config)
    await broker.publish(names.task("pushed"), b'"stored"')
    pushed = await asyncio.wait_for(handlers.raw.get(), timeout=5)
    await handlers.plain(b'"plain"')
    assert pushed.reply.startswith("$JS.ACK.")
    assert handlers.handled == handlers.listened == [b'"plain"']


class _CoreHandlers:
    """A subject's two kinds of core handler (``subscribe``, ``listen``), and a raw nats-py
    subscription beside them that sees everything sent there."""

    def __init__(self, broker: Broker, subject: str) -> None:
        self._broker, self._subject = broker, subject
        self.handled: list[bytes] = []
        self.listened: list[bytes] = []
        self.raw: asyncio.Queue[nats.aio.msg.Msg] = asyncio.Queue()
        self._got = asyncio.Event()

    @classmethod
    async def on(cls, broker: Broker, subject: str) -> _CoreHandlers:
        handlers = cls(broker, subject)
        await broker.subscribe(subject, handlers._handle)
        await listen(broker, subject, lambda msg: handlers.listened.append(msg.data))
        await broker.nc.subscribe(subject, cb=handlers.raw.put)
        return handlers

    async def _handle(self, msg: Inbound) -> None:
        self.handled.append(msg.data)
        self._got.set()

    async def plain(self, data: bytes) -> None:
        """Publish ``data`` as a party does, and wait until it is handled."""
        await self._broker.nc.publish(self._subject, data)
        await asyncio.wait_for(self._got.wait(), timeout=5)


async def test_a_server_s_answer_aimed_at_a_core_subject_is_not_handled(broker: Broker):
    """A party wrote what it liked under a key of its own and direct-got it with the reply
    aimed at a core subject it may not publish to: an agent's control subject took a
    heartbeat interval of 299 s from it, and every coordinator reloaded its config on one
    (a security re-test). Core handlers (``subscribe``, ``listen``) drop such answers, and
    an API response aimed there too; a real publish is handled."""
    names = broker.names
    subject = f"{names.prefix}.ctl.agent.victim"
    own = f"$KV.{names.executions_bucket}.x.t.attacker"
    await broker.publish(own, b'{"heartbeat_interval_s": 299}')
    handlers = await _CoreHandlers.on(broker, subject)
    direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
    await broker.nc.publish(direct, b"", reply=subject)
    await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=subject)
    forged = [await asyncio.wait_for(handlers.raw.get(), timeout=5) for _ in range(2)]
    await handlers.plain(b'{"heartbeat_interval_s": 1}')
    assert b'{"heartbeat_interval_s": 299}' in [m.data for m in forged]  # staged, sent on
    assert handlers.handled == handlers.listened == [b'{"heartbeat_interval_s": 1}']
